"""Reassemble Python tracebacks from log lines, one per printing process.

Each traceback line may carry a logger header or a worker prefix, and several workers may print at
once; `Line.message` has the prefixes removed and `Line.proc_key` keeps the processes apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import regex

from vllm_doctor.sources.lines import Line

FRAME = regex.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<lineno>\d+)(?:, in (?P<func>.+))?')
# `ValueError: msg`, `torch.OutOfMemoryError: msg`, `pydantic_core._pydantic_core.ValidationError: 1 ...`, a bare
# `Exception: msg` (the tokenizers library's Rust errors, `raise Exception(...)`)
EXCEPTION = regex.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Fault)|"
                          r"AssertionError|KeyboardInterrupt|Exception|[A-Za-z_][\w.]*\.[A-Z]\w+)(?::\s?(?P<msg>.*))?$")
# IPython's traceback (Jupyter, Colab; IPython/core/ultratb.py): a header that names the exception first, padded to
# the terminal's width (`RuntimeError                 Traceback (most recent call last)`), frames as `<file> in
# func(args)` (Colab links the file: `[/usr/…/x.py](https://localhost:8080/#) in f()`) with numbered source lines
# (`--> 13 …`, `----> 13 …` by version, marks the current one), and the exception last, as Python prints it.
IPYTHON_HEADER = regex.compile(r"^[A-Za-z_][\w.]{0,100}\s{1,120}Traceback \(most recent call last\)\s*$")
IPYTHON_FRAME = regex.compile(r"^(?:\[(?P<link>[^\]]{1,400})\]\([^)]{0,400}\)|(?P<file>\S{1,400}?\.py|<ipython-input-[\w-]{1,80}>))"
                              r" in (?P<func>[\w<>.: ]{1,200}?)\(")
# rich's traceback (rich.traceback, as typer-based CLIs print it): a box whose top border carries the header
# (`╭──── Traceback (most recent call last) ────╮`), frames as `│ /path/file.py:36 in func   │` with numbered code
# inside the box, then the exception below it, as Python prints it.
RICH_FRAME = regex.compile(r"^│ (?P<file>\S{1,400}?\.py):(?P<lineno>\d{1,7}) in (?P<func>[\w<>.]{1,200})\s{0,200}│?\s*$")
BOX = ("│", "╭", "╰", "─")
# an exception as its repr, the way `logger.exception(repr(e))` logs it: `AssertionError('…')`
EXCEPTION_REPR = regex.compile(r"(?P<type>[A-Za-z_][\w.]{0,100}(?:Error|Exception))\(")
# `[Bug]: ValueError: msg` (an issue title glued before it): searched only while a traceback waits for its exception
EMBEDDED_EXCEPTION = regex.compile(r"(?<![\w.])(?P<type>[A-Za-z_][\w.]*(?:Error|Exception)): (?P<msg>.+)$")
BLANK_WAIT = 4      # lines (of any process) a chain header may come after the blank line that ended a traceback
CHAIN = ("The above exception was the direct cause", "During handling of the above exception")
# Python's unraisable hook (sys.unraisablehook's default: an exception in `__del__`, a weakref callback, a finalizer at
# interpreter exit) prints this header, then the traceback, and goes on: the exception was ignored, never a failure
IGNORED = "Exception ignored in"
MAX_TAIL = 40      # continuation lines kept after the exception line (pydantic, multi-line ValueError)
# Lines of other processes after which a silent traceback is given up: an unprefixed traceback must not
# keep the scanner feeding every line of a multi-GB log to the engine.
MAX_IDLE = 50
# Lines of its own process that are neither frame, code nor exception, in a row, after which an open
# traceback is given up: a dangling `Traceback (most recent call last):` in an unprefixed log would
# otherwise keep every later line on the slow path.
MAX_STRAY = 50
# Frames kept per traceback: the outermost and the innermost halves (rules read the innermost; Python
# itself folds recursion into "[Previous line repeated N more times]", so real ones stay far below).
MAX_FRAMES = 256
MAX_LINES = 4096      # lines an open traceback takes in all before it is given up (frames and code included)


@dataclass
class Frame:
    file: str
    lineno: int
    func: str
    code: str = ""
    line: Line | None = None       # the log line that printed the frame


@dataclass
class Traceback:
    proc_key: str
    start: Line
    frames: list[Frame] = field(default_factory=list)
    exc_type: str | None = None
    message: str = ""
    exc_line: Line | None = None
    cause: "Traceback | None" = None       # the exception this one was raised from (chained)
    done: bool = False
    wrapper: bool = False
    end_seq: int = 0                        # the diagnoser's sequence number of the exception line
    start_seq: int = 0                      # ... and of the first line
    implicit: bool = False                  # opened on a frame line: the paste starts mid-traceback
    bare: bool = False                      # an exception line with no frames and no header
    ignored: bool = False                   # printed by Python's unraisable hook ("Exception ignored in: …")
    stray: int = 0                          # own-process lines in a row that fit no traceback shape
    taken: int = 0                          # lines taken while open
    frames_dropped: int = 0                 # middle frames not kept (MAX_FRAMES)
    ipython: bool = False                   # printed by IPython (IPYTHON_HEADER)
    rich: bool = False                      # printed by rich.traceback (a box: RICH_FRAME)

    @property
    def funcs(self) -> list[str]:
        return [f.func for f in self.frames]


class TracebackAssembler:
    """Feed lines in order; finished tracebacks accumulate in `finished`."""

    def __init__(self) -> None:
        self.open: dict[str, Traceback] = {}
        self.tail: dict[str, tuple[Traceback, int]] = {}   # exception lines still collecting continuation
        self.finished: list[Traceback] = []
        self._pending_cause: dict[str, Traceback] = {}
        # a traceback whose tail a blank line ended, by process, with the lines left to see a chain header
        self._after_blank: dict[str, tuple[Traceback, int]] = {}
        self._idle: dict[str, int] = {}
        self._last_lineno: dict[str, int] = {}
        self._ignored: dict[str, int] = {}   # by process: the line of an `Exception ignored in` header just seen

    @property
    def busy(self) -> bool:
        return bool(self.open or self.tail or self._after_blank)

    def current(self, line: Line) -> Traceback | None:
        key = line.proc_key
        if key in self.open:
            return self.open[key]
        if key in self.tail:
            return self.tail[key][0]
        return None

    def feed(self, line: Line) -> Traceback | None:
        """Returns the traceback this line belongs to, if any."""
        key = self._wrapped_into(line) or line.proc_key
        tb = self._feed(line, key)
        for other in list(self.tail) + list(self.open):
            if other != key:
                self._idle[other] = self._idle.get(other, 0) + 1
                # a lone pasted exception line continues on the very next lines, or not at all
                bare = other in self.tail and self.tail[other][0].bare
                if self._idle[other] > MAX_IDLE or bare:
                    self._give_up(other)
        self._idle.pop(key, None)
        return tb

    def _give_up(self, key: str) -> None:
        self._idle.pop(key, None)
        self._close_tail(key)
        tb = self.open.pop(key, None)
        if tb is not None:
            self.finished.append(tb)

    def _wrapped_into(self, line: Line) -> str | None:
        """A pasted line that a terminal wrapped loses its process prefix on the continued part: an
        unprefixed line right after a prefixed exception line continues that exception's message."""
        if line.pid is not None or line.rank is not None or line.level is not None or not line.message.strip():
            return None
        for key, (tb, _) in self.tail.items():
            if key != line.proc_key and self._last_lineno.get(key) == line.lineno - 1 and line.lineno:
                return key
        return None

    def _feed(self, line: Line, key: str) -> Traceback | None:
        msg = line.message
        self._last_lineno[key] = line.lineno
        ended = None
        if self._after_blank:
            ended = self._after_blank.pop(key, (None, 0))[0]
            for other, (tb0, left) in list(self._after_blank.items()):   # other processes' wait a few lines
                if left <= 1:
                    del self._after_blank[other]
                else:
                    self._after_blank[other] = (tb0, left - 1)
        if ended is not None and msg.startswith(CHAIN):
            # Python prints a blank line between an exception and "During handling of the above exception"
            self._pending_cause[key] = ended
            return ended
        # vLLM 0.7-0.8 V1 logs a traceback as the tail of a message: "EngineCore hit an exception: Traceback (...):"
        if msg.startswith(IGNORED):
            self._ignored[key] = line.lineno
        ipython = bool(msg[:1].isalpha() and msg.endswith(")") and IPYTHON_HEADER.match(msg))
        rich = msg.startswith("╭") and "Traceback (most recent call last)" in msg
        if msg.startswith("Traceback (most recent call last)") or msg.endswith("Traceback (most recent call last):") \
                or ipython or rich:
            self._close_tail(key)
            tb = Traceback(key, line, ipython=ipython, rich=rich)
            tb.ignored = self._ignored.pop(key, None) == line.lineno - 1 and line.lineno > 0
            tb.cause = self._pending_cause.pop(key, None)
            self.open[key] = tb
            return tb
        if key in self.tail:
            tb, count = self.tail[key]
            if msg.startswith(CHAIN):
                self._close_tail(key)
                self._pending_cause[key] = tb
                return tb
            stripped = msg.strip()
            continues = msg[:1].isspace() or not (_looks_like_new_record(line) or EXCEPTION.match(stripped))
            if stripped and continues and count < MAX_TAIL:
                tb.message = f"{tb.message}\n{stripped}" if tb.message else stripped
                self.tail[key] = (tb, count + 1)
                return tb
            self._close_tail(key)
            if not stripped:
                self._after_blank[key] = (tb, BLANK_WAIT)   # a chain header may follow the blank line
                return None
        tb = self.open.get(key)
        frame = FRAME.match(msg)
        if tb is None:
            if frame:
                # a paste that starts mid-traceback: frames with no `Traceback (most recent call last)` above
                tb = self.open[key] = Traceback(key, line, implicit=True)
                tb.cause = self._pending_cause.pop(key, None)
            else:
                return self._orphan(line)
        tb.taken += 1
        if tb.taken > MAX_LINES:         # given up; the line is read again as one outside any traceback
            self._give_up(key)
            return self._feed(line, key)
        if tb.rich and not frame and msg.startswith(BOX):
            if (rf := RICH_FRAME.match(msg)) is None:
                return tb           # the box's borders and numbered code
            frame = {"file": rf["file"], "lineno": rf["lineno"], "func": rf["func"]}
        if tb.ipython and not frame:
            if msg.startswith("--") and msg.lstrip("-").startswith(">"):
                return tb
            if (ip := IPYTHON_FRAME.match(msg)) is not None:
                frame = {"file": ip["link"] or ip["file"], "lineno": "0", "func": ip["func"]}
        if frame:
            if len(tb.frames) >= MAX_FRAMES:
                del tb.frames[MAX_FRAMES // 2]
                tb.frames_dropped += 1
            tb.frames.append(Frame(frame["file"], int(frame["lineno"]) if len(frame["lineno"]) <= 9 else 0,  # 0: unknown
                                   (frame["func"] or "").strip(), line=line))
            tb.stray = 0
            return tb
        if msg[:1].isspace() or not msg.strip():
            if tb.frames and msg.strip() and not position_marker(msg):
                tb.frames[-1].code = tb.frames[-1].code or msg.strip()
            return tb
        exc = EXCEPTION.match(msg.strip())
        if exc:
            tb.exc_type, tb.message, tb.exc_line = exc["type"], (exc["msg"] or "").strip(), line
            del self.open[key]
            self.tail[key] = (tb, 0)
            return tb
        # A line like `Exception raised in creation task:` or garbage inside the traceback: keep going,
        # up to MAX_STRAY such lines in a row.
        tb.stray += 1
        if tb.stray > MAX_STRAY:
            self._give_up(key)
            return None
        return tb

    def _orphan(self, line: Line) -> Traceback | None:
        """An exception line outside any traceback of its process. It ends the one open traceback that
        still lacks its exception (the parent process printed it, or an issue title was glued before
        it); with none open, it stands alone as a frameless traceback (a pasted error line)."""
        msg = line.message.strip()
        exc = EXCEPTION.match(msg)
        if exc is None:
            exc = EMBEDDED_EXCEPTION.search(msg) if self.open else None
            if exc is None:
                return None
        if exc["type"].endswith("Warning") or exc["msg"] is None:
            return None        # `FutureWarning: ...` is no failure; `Error` alone is a word, not an exception
        waiting = [tb for tb in self.open.values() if tb.exc_type is None]
        if len(waiting) == 1:
            tb = waiting[0]
            del self.open[tb.proc_key]
        elif not self.open and exc.start() == 0:
            tb = Traceback(line.proc_key, line, bare=True)
        else:
            return None
        tb.exc_type, tb.message, tb.exc_line = exc["type"], exc["msg"].strip(), line
        self._close_tail(line.proc_key)
        self.tail[line.proc_key] = (tb, 0)
        return tb

    def _close_tail(self, key: str) -> None:
        item = self.tail.pop(key, None)
        if item:
            item[0].done = True
            self.finished.append(item[0])

    def close(self) -> None:
        """End of input: a traceback cut mid-way is kept, marked not done."""
        for key in list(self.tail):
            self._close_tail(key)
        for tb in self.open.values():
            self.finished.append(tb)
        self.open.clear()
        self._after_blank.clear()       # no chain header can follow the end of the input


def _looks_like_new_record(line: Line) -> bool:
    return line.level is not None or line.message.startswith(("Traceback", "INFO", "WARNING", "ERROR", "[", "("))


# Loops that print an exception with sys.excepthook and go on, by (file, function) of the innermost frame: CPython's
# multiprocessing resource tracker (Lib/multiprocessing/resource_tracker.py, main, 3.8+) prints any error of its
# command loop, such as `KeyError: '/psm_…'` for a shared-memory name unregistered twice (vllm#5468), and reads on
PRINTED_AND_CONTINUED = (("multiprocessing/resource_tracker.py", "main"),)


def position_marker(msg: str) -> bool:
    """Python 3.11+'s `^^^^~~~~` under a frame's source line: where in it the error was."""
    text = msg.strip()
    return bool(text) and set(text) <= set("^~ ")


def traceback_body(msg: str) -> bool:
    """A line of a traceback's body seen on its own (its header cut away): a frame or a position marker."""
    return bool(FRAME.match(msg)) or position_marker(msg)


def failing(tb: Traceback) -> bool:
    """A traceback that shows a failure: an exception other than a warning, or one cut before it; not one a loop
    printed and went on from (PRINTED_AND_CONTINUED)."""
    last = tb.frames[-1] if tb.frames else None
    if last is not None and any(last.file.endswith(f) and last.func == fn for f, fn in PRINTED_AND_CONTINUED):
        return False
    if tb.ignored:
        return False
    return not (tb.exc_type or "").endswith("Warning") and (tb.exc_type is not None or bool(tb.frames))


# Python's own errors of a statement: a check raises ValueError/AssertionError (or a cut message hides the type);
# `rope_scaling["rope_type"]` failing with TypeError inside the check's function is a malformed input, not the check
STATEMENT_ERRORS = ("TypeError", "KeyError", "AttributeError", "IndexError", "NameError", "UnboundLocalError",
                    "ZeroDivisionError")


def statement_failed(tb: Traceback) -> bool:
    """The innermost frame's statement failed with one of Python's own errors rather than raising one."""
    exc = (tb.exc_type or "").rsplit(".", 1)[-1]
    code = tb.frames[-1].code.lstrip() if tb.frames else ""
    return exc in STATEMENT_ERRORS and not code.startswith(("raise", "assert"))

