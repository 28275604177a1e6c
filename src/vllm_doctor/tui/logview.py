"""The full-log widget: a Line-API ScrollView that renders only the visible rows of a LogIndex.

A row shows the line's message, the text the engine matches: the process prefix and the logger header
(`(APIServer pid=1) INFO 10-01 12:00:00 [file.py:12] `) take a third of an 80-column screen and say
little once the line is read; `raw` shows the lines as written.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from vllm_doctor.sources.lines import parse_line
from vllm_doctor.tui.logindex import LogIndex, level_of

LEVEL_STYLE = {"error": Style(color="red"), "warning": Style(color="yellow")}
GUTTER = Style(dim=True)
MATCH = Style(bgcolor="yellow", color="black", bold=True)
CURRENT = Style(bgcolor="grey23")
MARK = Style(bold=True)
MESSAGE_CACHE = 2048        # rows' messages kept (a screenful is redrawn on every scroll step)


class LogView(ScrollView, can_focus=True):
    """Rows are the log's lines, or (filter on) only the warning/error lines."""

    DEFAULT_CSS = "LogView { height: 1fr; overflow-x: hidden; }"
    hscroll = reactive(0)

    def __init__(self, index: LogIndex | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.filter_rows: array | None = None    # 0-based line numbers shown when the filter is on
        self.query_text = ""
        self.current: int | None = None          # 0-based line highlighted (search hit, evidence, goto)
        self.marks: set[int] = set()             # evidence lines (0-based)
        self.tail = False                        # keep the end in view as the log grows
        self.raw = False                         # rows as written (True) or their messages
        self._messages: OrderedDict[str, str] = OrderedDict()

    # ---- geometry -------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        if self.filter_rows is not None:
            return len(self.filter_rows)
        return self.index.line_count if self.index is not None else 0

    def row_line(self, row: int) -> int:
        return self.filter_rows[row] if self.filter_rows is not None else row

    def line_row(self, line: int) -> int:
        if self.filter_rows is None:
            return line
        import bisect

        return max(0, min(len(self.filter_rows) - 1, bisect.bisect_left(self.filter_rows, line)))

    def sync_size(self) -> None:
        at_end = self.scroll_y >= self.max_scroll_y - 1
        self.virtual_size = Size(self.size.width, self.rows)
        if self.tail and at_end:
            self.scroll_end(animate=False, immediate=True)
        self.refresh()

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, self.rows)

    @property
    def top_line(self) -> int:
        return self.row_line(min(int(self.scroll_y), max(0, self.rows - 1))) if self.rows else 0

    def show_line(self, line: int) -> None:
        """Scroll so that 0-based `line` is in the middle and highlight it."""
        self.current = line
        self.virtual_size = Size(self.size.width, self.rows)
        row = self.line_row(line)
        self.scroll_to(y=max(0, row - self.size.height // 2), animate=False, immediate=True)
        self.refresh()

    # ---- rendering ------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.size.width
        row = int(self.scroll_y) + y
        if self.index is None or row >= self.rows:
            return Strip.blank(width, self.rich_style)
        line = self.row_line(row)
        text = self.index.line(line)
        digits = self.number_cells - 1
        base = self.rich_style
        level = level_of(text)
        body_style = base + LEVEL_STYLE[level] if level else base
        if line == self.current:
            body_style += CURRENT
        if line in self.marks:
            body_style += MARK
        marker = "▶" if line in self.marks else " "
        segments = [Segment(f"{line + 1:>{digits}}{marker}", base + GUTTER)]
        body = text if self.raw else self._message(text)
        body = body[self.hscroll:] if self.hscroll else body
        segments += self._highlight(body, body_style)
        return Strip(segments).crop(0, width).adjust_cell_length(width, body_style if line == self.current
                                                                  else base)

    def _highlight(self, body: str, style: Style) -> list[Segment]:
        q = self.query_text
        if not q:
            return [Segment(body, style)]
        out, pos, low, ql = [], 0, body.lower(), q.lower()
        while True:
            i = low.find(ql, pos)
            if i < 0:
                break
            if i > pos:
                out.append(Segment(body[pos:i], style))
            out.append(Segment(body[i:i + len(q)], style + MATCH))
            pos = i + len(q)
        out.append(Segment(body[pos:], style))
        return out

    def _message(self, text: str) -> str:
        message = self._messages.get(text)
        if message is None:
            message = self._messages[text] = parse_line(text).message
            if len(self._messages) > MESSAGE_CACHE:
                self._messages.popitem(last=False)
        return message

    def shown_text(self, line: int) -> str:
        """The text row `line` (0-based) shows, before the horizontal scroll."""
        if self.index is None:
            return ""
        text = self.index.line(line)
        return text if self.raw else self._message(text)

    @property
    def number_cells(self) -> int:
        """Cells before the text: the line number and the evidence marker."""
        return max(4, len(str(self.index.line_count if self.index is not None else 0))) + 1

    def reveal(self, line: int, needle: str) -> bool:
        """Scroll sideways so that the first `needle` of line `line` is in view; False when the row does
        not show it (the hit is in the prefix that messages leave out)."""
        col = self.shown_text(line).lower().find(needle.lower())
        if col < 0:
            return False
        width = max(1, self.size.width - self.number_cells)
        if col < self.hscroll or col + len(needle) > self.hscroll + width:
            self.hscroll = max(0, col - width // 4)     # a quarter in: some of what leads to it shows too
        return True

    def watch_hscroll(self) -> None:
        self.refresh()

    def action_shift(self, delta: int) -> None:
        self.hscroll = max(0, self.hscroll + delta)

    def toggle_raw(self) -> None:
        self.raw = not self.raw
        self.hscroll = 0
        self.refresh()
