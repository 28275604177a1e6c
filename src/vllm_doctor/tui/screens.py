"""The app's modal screens: the key help and the one-line prompt (search, go to line, save)."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 76; max-width: 100%; height: auto; max-height: 90%;
                                  border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        text = Text("vllm-doctor triage — keys\n\n", style="bold")
        for key, desc in self.rows:
            text.append(f"  {key:<14}", style="bold cyan")
            text.append(desc + "\n")
        text.append("\nThe findings are the same as `vllm-doctor --format json` reports; the root cause is "
                    "listed first.\nPress escape or ? to close.", style="dim")
        with VerticalScroll():
            yield Static(text, id="help-body")


class PromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PromptScreen { align: center bottom; }
    PromptScreen > Vertical { width: 100%; height: auto; background: $surface; border-top: tall $accent; }
    """

    def __init__(self, label: str, value: str = "") -> None:
        super().__init__()
        self.label, self.value = label, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.label)
            yield Input(value=self.value, id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
