"""The triage session: a Textual app over a saved log, a growing log, a pipe or a wrapped command.

The app renders what the pipeline produces (the same Diagnosis the JSON report serialises); it decides
nothing itself. Diagnoses arrive as `Diagnosed` messages: of a saved log from `diagnose_paths` (in a
child process for a big one, worker.py); of a growing log, a pipe or a wrapped command from the live
session that `vllm-doctor --follow` and the pipe use, fed the new bytes as they come (live.py).
"""
from __future__ import annotations

import io
import os
import threading
import time
from array import array

from rich.console import Console
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import HorizontalScroll, VerticalScroll
from textual.widgets import Footer, OptionList, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from vllm_doctor.tui import saving, view
from vllm_doctor.tui.messages import Diagnosed, LiveNotice, LogGrew
from vllm_doctor.tui.screens import HelpScreen, PromptScreen
from vllm_doctor.tui.logindex import LogIndex, merged
from vllm_doctor.tui.logview import LogView

TABS = ("cause", "fix", "evidence", "facts", "log")
# The footer names what a key does where it is pressed: n/p step through the search hits on the Log tab
# and through the finding's evidence lines elsewhere. Keys of the other view stay live through a hidden
# twin binding (action "elsewhere"), so that the 80 columns name only what applies here.
LOG_KEYS = {"hit", "goto", "filter", "raw"}            # shown on the Log tab
FINDING_KEYS = {"step", "copy", "save"}                # shown on the other tabs
COPY_SENT = ("Corrected command sent to the terminal's clipboard (OSC 52); your terminal may ignore it "
             "— press s to save it to a file.")
SMALL_EVIDENCE_FILE = 64 << 20
PROGRESS_EVERY = 0.5                # seconds between indexing progress updates
PROCESS_MIN_BYTES = 8 << 20        # logs at least this big are diagnosed in a child process (worker.py)


class TriageApp(App):
    TITLE = "vllm-doctor"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #header { height: 2; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    #findings { height: auto; max-height: 6; border: none; padding: 0; }
    #tabs { height: 1fr; }
    TabPane { padding: 0 1; }
    #log-status { height: 1; background: $boost; color: $text-muted; }
    .commands { height: auto; }
    .commands Static { width: auto; }
    """
    BINDINGS = [
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
        Binding("y", "copy", "copy", tooltip="send the corrected command to the terminal's clipboard (OSC 52)"),
        Binding("s", "save", "save", tooltip="save the corrected command (or the finding's report) to a file"),
        Binding("right_square_bracket", "finding(1)", "next finding", key_display="]", show=False),
        Binding("left_square_bracket", "finding(-1)", "previous finding", key_display="[", show=False),
        Binding("n", "step(1)", "next evidence", tooltip="the finding's next evidence line"),
        Binding("p", "step(-1)", "prev evidence", tooltip="the finding's previous evidence line"),
        Binding("n", "hit(1)", "next hit", tooltip="the next line with the search text (Log tab)"),
        Binding("p", "hit(-1)", "prev hit", tooltip="the previous line with the search text (Log tab)"),
        Binding("slash", "search", "find", key_display="/", tooltip="search the log"),
        Binding("g", "goto", "goto line", tooltip="go to a line number of the log"),
        Binding("w", "filter", "warnings",
                tooltip="only warning and error lines, and every finding's evidence (toggle)"),
        Binding("r", "raw", "raw", tooltip="the log's lines as written, prefixes and logger headers kept (toggle)"),
        Binding("y", "elsewhere('copy')", show=False),
        Binding("s", "elsewhere('save')", show=False),
        Binding("g", "elsewhere('goto')", show=False),
        Binding("w", "elsewhere('filter')", show=False),
        Binding("r", "elsewhere('raw')", show=False),
        Binding("o", "open_evidence", "open evidence in log", show=False),
        Binding("1", "tab('cause')", "Cause tab", show=False),
        Binding("2", "tab('fix')", "Fix tab", show=False),
        Binding("3", "tab('evidence')", "Evidence tab", show=False),
        Binding("4", "tab('facts')", "Facts tab", show=False),
        Binding("5", "tab('log')", "Log tab", show=False),
        Binding("left", "scroll_log(-8)", "Log left", show=False),
        Binding("right", "scroll_log(8)", "Log right", show=False),
    ]

    def __init__(self, paths: list[str], catalog=None, options=None, *, title: str | None = None,
                 follow: bool = False, feed=None, diagnose=None, process: bool | None = None,
                 live_quiet: float | None = None, live_open_traceback: float | None = None, mask=None) -> None:
        super().__init__()
        self.mask = mask                        # --anonymize: what leaves by `y` and `s` is masked
        self.paths = list(paths)
        self.catalog = catalog
        self.options = options
        self.follow = follow
        self.feed = feed
        self._diagnose_fn = diagnose
        self._process_wanted = process          # None: by size (PROCESS_MIN_BYTES); False: always a thread
        self._process = None                    # worker.DiagnosisProcess once started
        self._process_failed = False
        self._live = None                       # live.LiveDiagnosis of a growing log or a stream
        self._live_quiet = live_quiet           # None: live.QUIET_S
        self._live_open_traceback = live_open_traceback     # None: live.OPEN_TRACEBACK_S
        self.notices: list[str] = []            # the live session's notices, as shown
        self.live_state: str | None = None      # the kind of the live diagnosis shown (see Diagnosed)
        self.title_text = title or (", ".join(os.path.basename(p) for p in self.paths) or "<stdin>")
        self.diagnosis = None
        self.final = False
        self.error: str | None = None
        self.selected = 0
        self.evidence_k = 0
        self.search_text = ""
        self._stop = threading.Event()
        self._indexes: dict[str, LogIndex | None] = {}
        self.index = LogIndex(self.paths[0]) if self.paths else None
        if self.index is not None:
            self._indexes[self.paths[0]] = self.index
        self._filter_stop: threading.Event | None = None
        self._filter_extra: list[int] = []      # evidence lines the filter keeps (_evidence_lines)
        self._grew_pending = threading.Event()

    # ---- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(self._header(), id="header")
        yield OptionList(id="findings")
        with TabbedContent(id="tabs", initial="fix"):
            with TabPane("1 Cause", id="cause"):
                with VerticalScroll():
                    yield Static("", id="cause-body")
            with TabPane("2 Fix", id="fix"):
                with VerticalScroll():
                    yield Static("", id="fix-body")
                    # commands are never wrapped (a mouse copy must give the whole line): they scroll sideways
                    with HorizontalScroll(classes="commands"):
                        yield Static("", id="fix-commands")
                    yield Static("", id="fix-tail")
                    with HorizontalScroll(classes="commands"):
                        yield Static("", id="fix-alt-commands")
            with TabPane("3 Evidence", id="evidence"):
                with VerticalScroll():
                    yield Static("", id="evidence-body")
            with TabPane("4 Facts", id="facts"):
                with VerticalScroll():
                    yield Static("", id="facts-body")
            with TabPane("5 Log", id="log"):
                yield LogView(self.index, id="logview")
                yield Static("", id="log-status")
        yield Footer()

    @property
    def live(self) -> bool:
        return self.follow or self.feed is not None

    @property
    def running(self) -> bool:
        return self.feed is not None and not self.feed.ended.is_set() or (self.follow and not self.final
                                                                             and self.diagnosis is None)

    def _header(self) -> Text:
        extra = ""
        if self.index is not None:
            extra = f"{self.index.line_count:,} lines" + ("" if self.index.done else " (indexing…)")
        if self.feed is not None and self.feed.ended.is_set() and self.feed.returncode is not None:
            extra += f"  exit {self.feed.returncode}"
        if self.follow:
            extra += "  following"
        if self.error:
            extra += f"  error: {self.error}"
        running = self.feed is not None and not self.feed.ended.is_set()
        return view.header_text(self.diagnosis, self.title_text, running=running, extra=extra,
                                diagnosing=self.live_state == "diagnosing")

    def on_mount(self) -> None:
        self.query_one("#findings", OptionList).add_option(Option(Text("diagnosing…", style="dim")))
        logview = self.query_one(LogView)
        logview.tail = self.live
        self._update_log_status()
        if self.index is not None:
            self._index_worker()
        # The diagnosis starts once the first screen is on the terminal: it competes for the CPU.
        self.call_after_refresh(self._diagnose_worker)

    # ---- workers --------------------------------------------------------------------------------
    def _grew(self) -> None:
        """Tell the app the log has more lines; at most one such message waits at a time (every one
        costs a layout and a repaint, and a flood of them starves the keys)."""
        if not self._grew_pending.is_set():
            self._grew_pending.set()
            self.post_message(LogGrew())

    @work(thread=True, exclusive=True, group="index")
    def _index_worker(self) -> None:
        index = self.index
        last = [0.0]                      # the first block is shown at once, then every PROGRESS_EVERY

        def progress() -> None:
            now = time.monotonic()
            if now - last[0] > PROGRESS_EVERY:
                last[0] = now
                self._grew()

        index.build(progress)
        self._grew_pending.clear()
        self.post_message(LogGrew())
        if self.live:
            index.follow(self._grew)

    def _use_process(self) -> bool:
        if self._diagnose_fn is not None or self._process_failed or self._process_wanted is False:
            return False
        if self._process_wanted:
            return True
        try:
            return sum(os.path.getsize(p) for p in self.paths) >= PROCESS_MIN_BYTES
        except OSError:
            return False

    def _run_diagnosis(self):
        if self._diagnose_fn is not None:
            return self._diagnose_fn(self.paths)
        if self._use_process():
            from vllm_doctor.tui import worker

            try:
                if self._process is None:
                    self._process = worker.DiagnosisProcess(self.catalog, self.options)
                    if self._stop.is_set():          # quit while it started: on_unmount missed it
                        self._process.close()
                        raise worker.Cancelled()
                return self._process.diagnose(self.paths, self._stop)
            except worker.Unavailable:
                if self._stop.is_set():
                    raise worker.Cancelled() from None
                self._process_failed = True      # diagnose in this process from now on
                self._close_process()
        from vllm_doctor.diagnosis.saved import diagnose_paths

        return diagnose_paths(self.paths, self.catalog, self.options)

    @work(thread=True, exclusive=True, group="diagnose")
    def _diagnose_worker(self) -> None:
        # The first screen of the log comes first: the scan competes for the interpreter.
        deadline = time.monotonic() + 1.0
        while (self.index is not None and self.index.line_count < 200 and not self.index.done
               and time.monotonic() < deadline and not self._stop.is_set()):
            self._stop.wait(0.01)
        if not self.live:
            self._diagnose_once(final=True)
            return
        from vllm_doctor.tui.live import OPEN_TRACEBACK_S, QUIET_S, LiveDiagnosis

        live = LiveDiagnosis(
            self.paths[0], self.catalog, self.options,
            on_update=lambda d, kind: self.post_message(Diagnosed(d, kind == "final", kind=kind)),
            on_notice=lambda text: self.post_message(LiveNotice(text)),
            ended=self.feed.ended if self.feed is not None else None,
            quiet=QUIET_S if self._live_quiet is None else self._live_quiet,
            open_traceback=OPEN_TRACEBACK_S if self._live_open_traceback is None else self._live_open_traceback)
        self._live = live
        if self._stop.is_set():              # quit while it was made: on_unmount may have missed it
            live.stop()
        try:
            live.run()
        except Exception as exc:  # shown, never a traceback
            self.post_message(Diagnosed(None, False, f"{type(exc).__name__}: {exc}"))

    def _diagnose_once(self, final: bool) -> None:
        from vllm_doctor.tui.worker import Cancelled, ChildError

        try:
            diagnosis = self._run_diagnosis()
        except Cancelled:
            return
        except ChildError as exc:
            self.post_message(Diagnosed(None, final, str(exc)))
            return
        except Exception as exc:  # an unreadable file or a broken snapshot: shown, never a traceback
            self.post_message(Diagnosed(None, final, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(Diagnosed(diagnosis, final))

    # ---- messages -------------------------------------------------------------------------------
    def on_diagnosed(self, message: Diagnosed) -> None:
        self.error = message.error
        self.live_state = message.kind
        self.final = message.final
        previous = self.current_finding
        if message.diagnosis is not None:
            self.diagnosis = message.diagnosis
        findings = self.findings
        try:
            options = self.query_one("#findings", OptionList)
        except NoMatches:                 # the app is closing: a late message, its widgets gone
            return
        options.clear_options()
        if message.error and not findings:
            options.add_option(Option(Text(f"cannot diagnose: {message.error}", style="red")))
        elif not findings and message.kind == "diagnosing":
            options.add_option(Option(Text("diagnosing… (a traceback is still arriving)", style="bold cyan")))
        elif not findings:
            state = "no problem found so far" if not message.final else "no problem found"
            warnings = getattr(self.diagnosis, "warnings", []) if self.diagnosis else []
            label = Text(f"✔ {state}", style="bold green")
            if warnings:
                label.append(f"  ({len(warnings)} warning(s) seen: see Log, w)", style="yellow")
            options.add_option(Option(label))
        else:
            for i, f in enumerate(findings):
                options.add_option(Option(view.finding_label(f, i), id=f"finding-{i}"))
        self.selected = 0
        if previous is not None:
            for i, f in enumerate(findings):
                if f.rule == previous.rule:
                    self.selected = i
        if findings:
            options.highlighted = self.selected
        self.evidence_k = 0
        self._refresh_panes()
        self._filter_follow_diagnosis()
        if not findings and message.final and not self.live:
            self.query_one("#tabs", TabbedContent).active = "log"

    def on_live_notice(self, message: LiveNotice) -> None:
        """A notice as a toast: its first line, the file named by its line number only."""
        first = message.text.strip().splitlines()[0] if message.text.strip() else ""
        first = first.removeprefix("vllm-doctor:").strip()
        if self.paths:
            first = first.replace(f" {self.paths[0]}:", " line ")
        if not first:
            return
        self.notices.append(first)
        severity = ("error" if first.startswith("failure") else
                    "warning" if first.startswith("warning") else "information")
        self.notify(first, severity=severity)

    def on_log_grew(self, message: LogGrew) -> None:
        self._grew_pending.clear()
        try:
            logview = self.query_one(LogView)
        except NoMatches:                 # the app is closing (the index thread's last word)
            return
        logview.sync_size()
        self.query_one("#header", Static).update(self._header())
        self._update_log_status()
        if logview.filter_rows is not None and self.index is not None and self.index.done:
            self._filter_more()

    @on(OptionList.OptionHighlighted, "#findings")
    def _finding_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_index != self.selected and event.option_index < len(self.findings):
            self.selected = event.option_index
            self.evidence_k = 0
            self._refresh_panes()

    # ---- state ----------------------------------------------------------------------------------
    @property
    def findings(self) -> list:
        return list(self.diagnosis.findings) if self.diagnosis is not None else []

    @property
    def current_finding(self):
        findings = self.findings
        return findings[self.selected] if 0 <= self.selected < len(findings) else None

    @property
    def old_command(self) -> str | None:
        return self.diagnosis.facts.get("launch.command") if self.diagnosis is not None else None

    def reader(self, source: str) -> LogIndex | None:
        if source in self._indexes:
            return self._indexes[source]
        index = None
        try:
            if source and os.path.getsize(source) <= SMALL_EVIDENCE_FILE:
                index = LogIndex(source)
                index.build()
        except OSError:
            index = None
        self._indexes[source] = index
        return index

    def _refresh_panes(self) -> None:
        self.query_one("#header", Static).update(self._header())
        f = self.current_finding
        cause = self.query_one("#cause-body", Static)
        fix = self.query_one("#fix-body", Static)
        evidence = self.query_one("#evidence-body", Static)
        if f is None:
            empty = Text("No finding" + ("" if self.final else " yet") + ".", style="dim")
            if self.diagnosis is not None and self.diagnosis.warnings:
                for w in self.diagnosis.warnings[:5]:
                    empty.append(f"\nwarning seen: {w.line.message.strip()[:200]} [{w.rule_id}]", style="yellow")
            cause.update(empty)
            fix.update(Text("Nothing to fix" + ("." if self.final else " so far."), style="dim"))
            self._show_fix_parts(None, None, None)
            evidence.update(Text("No evidence.", style="dim"))
        else:
            cause.update(view.cause_renderable(f))
            head, commands, tail, alt_commands = view.fix_parts(f, self.old_command)
            fix.update(head)
            self._show_fix_parts(commands, tail, alt_commands)
            self._refresh_evidence()
        if self.diagnosis is not None:
            self.query_one("#facts-body", Static).update(view.facts_renderable(self.diagnosis.facts))
        self._mark_evidence()

    def _refresh_evidence(self) -> None:
        f = self.current_finding
        if f is None:
            return
        self.query_one("#evidence-body", Static).update(view.evidence_renderable(f, self.evidence_k, self.reader))

    def _mark_evidence(self) -> None:
        logview = self.query_one(LogView)
        f = self.current_finding
        main = self.paths[0] if self.paths else None
        logview.marks = {ln.lineno - 1 for ln in (f.evidence if f else []) if ln.source == main}
        logview.refresh()

    def _update_log_status(self) -> None:
        logview = self.query_one(LogView)
        parts = []
        if self.index is None:
            parts.append("no log file")
        else:
            parts.append(f"{self.index.line_count:,} lines" + ("" if self.index.done else " indexing…"))
        if logview.filter_rows is not None:
            parts.append(f"filter: {len(logview.filter_rows):,} warning/error/evidence lines")
        if self.search_text:
            parts.append(f"search: {self.search_text!r}")
        if logview.raw:
            parts.append("raw lines")
        parts.append("←/→ pan")
        self.query_one("#log-status", Static).update(Text(" · ".join(parts)))

    # ---- actions --------------------------------------------------------------------------------
    @property
    def active_tab(self) -> str:
        try:
            return self.query_one("#tabs", TabbedContent).active
        except NoMatches:                 # a modal screen is on top, or the app is closing
            return ""

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """Which of a key's two bindings is live (and in the footer) on the tab shown: see LOG_KEYS."""
        on_log = self.active_tab == "log"
        if action == "elsewhere":
            name = parameters[0] if parameters else ""
            return on_log if name in FINDING_KEYS else not on_log
        if action in LOG_KEYS:
            return on_log
        if action in FINDING_KEYS:
            return not on_log
        return True

    @on(TabbedContent.TabActivated, "#tabs")
    def _tab_activated(self) -> None:
        self.refresh_bindings()

    def action_elsewhere(self, name: str) -> None:
        """A key of the other view, pressed here: what it does there (w, g, r open the Log tab)."""
        getattr(self, f"action_{name}")()

    def action_hit(self, delta: int) -> None:
        self._search(backwards=delta < 0)

    def action_raw(self) -> None:
        self.action_tab("log")
        self.query_one(LogView).toggle_raw()
        self._update_log_status()

    def action_tab(self, name: str) -> None:
        self.query_one("#tabs", TabbedContent).active = name
        if name == "log":
            self.query_one(LogView).focus()

    def action_finding(self, delta: int) -> None:
        findings = self.findings
        if not findings:
            return
        self.selected = (self.selected + delta) % len(findings)
        self.evidence_k = 0
        self.query_one("#findings", OptionList).highlighted = self.selected
        self._refresh_panes()

    def action_step(self, delta: int) -> None:
        f = self.current_finding
        if f is None or not f.evidence:
            return
        self.evidence_k = (self.evidence_k + delta) % len(f.evidence)
        if self.active_tab != "evidence":
            self.query_one("#tabs", TabbedContent).active = "evidence"
        self._refresh_evidence()

    def action_open_evidence(self) -> None:
        f = self.current_finding
        if f is None or not f.evidence:
            return
        line = f.evidence[min(self.evidence_k, len(f.evidence) - 1)]
        self.action_tab("log")
        self.goto_line(line.lineno)

    def action_copy(self) -> None:
        text = view.fix_command_text(self.current_finding)
        if not text:
            what = "press s to save the finding's report" if self.current_finding is not None else "no finding"
            self.notify(f"No corrected command to copy ({what}).", severity="warning")
            return
        self.copy_to_clipboard(self.mask(text) if self.mask else text)   # OSC 52: no answer comes back
        self.notify(COPY_SENT)

    def action_save(self) -> None:
        f = self.current_finding
        if f is None:
            self.notify("No finding to save.", severity="warning")
            return
        what = "the corrected command" if saving.has_command(f) else "this finding's report"

        def done(path: str | None) -> None:
            if path:
                self.save_finding(path)

        self.push_screen(PromptScreen(f"Save {what} to (enter to save, escape to cancel):",
                                      saving.free_name(f)), done)

    def save_finding(self, path: str) -> bool:
        """Write the selected finding's script (or report) to `path` and say where it went."""
        f = self.current_finding
        if f is None:
            return False
        try:
            what = saving.save(path, f, self.old_command, mask=self.mask)
        except OSError as exc:
            self.notify(f"cannot write {path}: {exc.strerror or exc}", severity="error")
            return False
        where = path if os.path.dirname(path) else f"{path} in {os.getcwd()}"
        self.notify(f"Saved the {what} to {where}")
        return True

    def action_help(self) -> None:
        rows = [(b.key_display or b.key, b.tooltip or b.description) for b in self.BINDINGS
                if not b.action.startswith("elsewhere")]
        rows += [("↑/↓ PgUp/PgDn", "move in the findings list / scroll the focused pane"),
                 ("tab", "move focus (findings list, tabs, log)")]
        self.push_screen(HelpScreen(rows))

    def action_scroll_log(self, delta: int) -> None:
        if self.active_tab == "log":
            self.query_one(LogView).action_shift(delta)

    def action_search(self) -> None:
        self.action_tab("log")

        def done(text: str | None) -> None:
            if text:
                self.search_text = text
                self.query_one(LogView).query_text = text
                self._search(backwards=False)

        self.push_screen(PromptScreen("Search the log (case-insensitive):", self.search_text), done)

    def action_goto(self) -> None:
        self.action_tab("log")

        def done(text: str | None) -> None:
            if text is None:
                return
            try:
                self.goto_line(int(text.strip().replace(",", "")))
            except ValueError:
                self.notify(f"not a line number: {text!r}", severity="warning")

        self.push_screen(PromptScreen("Go to line:", ""), done)

    def goto_line(self, lineno: int) -> None:
        if self.index is None:
            return
        total = self.index.line_count
        if lineno > total:
            self.notify(f"line {lineno:,} is past the end ({total:,} lines"
                        + ("" if self.index.done else " indexed so far") + ")", severity="warning")
            lineno = total
        self.query_one(LogView).show_line(max(0, lineno - 1))

    def _search(self, backwards: bool) -> None:
        if not self.search_text or self.index is None:
            if not self.search_text:
                self.notify("Press / to search first.")
            return
        logview = self.query_one(LogView)
        start = logview.current if logview.current is not None else logview.top_line - (0 if backwards else 1)
        self._search_worker(self.search_text, start, backwards)

    @work(thread=True, exclusive=True, group="search")
    def _search_worker(self, text: str, start: int, backwards: bool) -> None:
        line = self.index.search(text, start, backwards=backwards, stop=self._stop)
        self.call_from_thread(self._search_done, text, line)

    def _search_done(self, text: str, line: int | None) -> None:
        self._update_log_status()
        if line is None:
            self.notify(f"{text!r} not found", severity="warning")
            return
        logview = self.query_one(LogView)
        if logview.filter_rows is not None:
            logview.filter_rows = None              # a hit may be an ordinary line: show everything
            self._update_log_status()
        logview.show_line(line)
        if not logview.reveal(line, text):
            self.notify(f"The hit on line {line + 1:,} is in the prefix that messages leave out: "
                        "r shows the lines as written.")

    def action_filter(self) -> None:
        self.action_tab("log")
        logview = self.query_one(LogView)
        if self._filter_stop is not None:
            self._filter_stop.set()
            self._filter_stop = None
        if logview.filter_rows is not None:
            logview.filter_rows = None
            logview.sync_size()
            if logview.current is not None:
                logview.show_line(logview.current)
        else:
            self._filter_restart()
        self._update_log_status()

    def _filter_restart(self) -> None:
        logview = self.query_one(LogView)
        logview.filter_rows = array("Q")
        self._filter_extra = self._evidence_lines()
        logview.scroll_to(y=0, animate=False, immediate=True)
        logview.sync_size()
        self._filter_more()

    def _filter_follow_diagnosis(self) -> None:
        """A new diagnosis cites other lines: the filter on, its rows are worked out again."""
        logview = self.query_one(LogView)
        if logview.filter_rows is None or self._evidence_lines() == self._filter_extra:
            return
        if self._filter_stop is not None:
            self._filter_stop.set()
            self._filter_stop = None
        self._filter_restart()
        self._update_log_status()

    def _evidence_lines(self) -> list[int]:
        """The filter keeps these whatever their level (a root cause is often an INFO or unleveled line)."""
        return view.evidence_lines(self.diagnosis, self.paths[0] if self.paths else None)

    def _filter_more(self) -> None:
        logview = self.query_one(LogView)
        if logview.filter_rows is None or (self._filter_stop is not None and not self._filter_stop.is_set()):
            return
        self._filter_stop = threading.Event()
        rows = logview.filter_rows
        self._filter_worker(rows, rows[-1] + 1 if rows else 0, self._filter_stop, self._filter_extra)

    @work(thread=True, group="filter")
    def _filter_worker(self, rows: array, first: int, stop: threading.Event, extra: list[int]) -> None:
        last = time.monotonic()
        for line in merged(self.index.problems(stop, first), [n for n in extra if n >= first]):
            if stop.is_set() or self._stop.is_set():
                return
            # a cited line not indexed yet comes with the next pass (_filter_more), in its place
            if (not rows or line > rows[-1]) and line < self.index.line_count:
                rows.append(line)
            if time.monotonic() - last > 0.1:
                last = time.monotonic()
                self.call_from_thread(self._filter_progress)
        stop.set()
        if not self._stop.is_set():
            self.call_from_thread(self._filter_progress)

    def _filter_progress(self) -> None:
        self.query_one(LogView).sync_size()
        self._update_log_status()

    def on_unmount(self) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.stop()
        if self._filter_stop is not None:
            self._filter_stop.set()
        for index in self._indexes.values():
            if index is not None:
                index.stop()
        if self.feed is not None:
            self.feed.stop()
        self._close_process()

    def _close_process(self) -> None:
        proc, self._process = self._process, None
        if proc is not None:
            proc.close()

    # ---- for tests and the corpus check -----------------------------------------------------------
    def _show_fix_parts(self, commands, tail, alt_commands) -> None:
        """The Fix pane's parts after its prose; an empty part takes no room."""
        for name, part in (("fix-commands", commands), ("fix-tail", tail), ("fix-alt-commands", alt_commands)):
            widget = self.query_one(f"#{name}", Static)
            widget.update(part if part is not None else "")
            widget.display = part is not None
            if widget.parent is not None and widget.parent.has_class("commands"):
                widget.parent.display = part is not None

    def pane_text(self, pane: str, width: int = 200) -> str:
        """Plain text of a pane's content (cause, fix, evidence, facts) as rendered; the Fix pane's parts in order."""
        names = ["fix-body", "fix-commands", "fix-tail", "fix-alt-commands"] if pane == "fix" else [f"{pane}-body"]
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
        for name in names:
            widget = self.query_one(f"#{name}", Static)
            if widget.display and widget.content:
                console.print(widget.content)
        return console.export_text()
