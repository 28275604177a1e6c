"""The full-log widget: a Line-API ScrollView that renders only the visible rows of a LogIndex."""
from __future__ import annotations

from array import array

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from vllm_doctor.tui.logindex import LogIndex, level_of

LEVEL_STYLE = {"error": Style(color="red"), "warning": Style(color="yellow")}
GUTTER = Style(dim=True)
MATCH = Style(bgcolor="yellow", color="black", bold=True)
CURRENT = Style(bgcolor="grey23")
MARK = Style(bold=True)


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
        digits = max(4, len(str(self.index.line_count)))
        base = self.rich_style
        level = level_of(text)
        body_style = base + LEVEL_STYLE[level] if level else base
        if line == self.current:
            body_style += CURRENT
        if line in self.marks:
            body_style += MARK
        marker = "▶" if line in self.marks else " "
        segments = [Segment(f"{line + 1:>{digits}}{marker}", base + GUTTER)]
        body = text[self.hscroll:] if self.hscroll else text
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

    def watch_hscroll(self) -> None:
        self.refresh()

    def action_shift(self, delta: int) -> None:
        self.hscroll = max(0, self.hscroll + delta)
