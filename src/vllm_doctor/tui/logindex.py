"""A lazily built line index over a log file of any size (no Textual here: pure, testable).

The log's text is never held in memory: `LogIndex` keeps the byte offset where every line starts in an
`array('Q')` (8 bytes a line), built block by block by `build()` (run it in a worker thread), and reads
lines on demand by seeking. A file that grows (a followed log, the spool of a pipe) is picked up by
calling `build()` again (or `follow()` in a thread). Search and the warnings/errors filter scan the file
in blocks with a compiled bytes pattern and map hits to line numbers with a bisect over the offsets.
"""
from __future__ import annotations

import bisect
import os
import re
import threading
from array import array
from collections import OrderedDict
from typing import Callable, Iterable, Iterator, Sequence

from vllm_doctor.sources.lines import clean_text

BLOCK = 8 << 20
FIRST_BLOCK = 64 << 10             # a search reads this much first, then 4x more a block up to BLOCK
MAX_LINE_BYTES = 16 << 10          # a line is shown up to this many bytes ("…" after)
CACHE_LINES = 4096

# Warnings and errors: vLLM's logger levels, glog's E/W/F, tracebacks and exception lines.
PROBLEM = re.compile(
    rb"(?:WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d |\[[EWF]\d{4} |Traceback \(most recent call last\)"
    rb"|\b\w*(?:Error|Exception)\b: |NCCL WARN|\berror: ")
LEVEL_ERROR = re.compile(r"(?:ERROR|CRITICAL) \d\d-\d\d |\[[EF]\d{4} |Traceback \(most|\w*(?:Error|Exception): "
                         r"|\berror: ")
LEVEL_WARNING = re.compile(r"(?:WARNING|WARN) \d\d-\d\d |\[W\d{4} |NCCL WARN")

try:  # numpy finds newlines ~20x faster than a Python loop; it comes with transformers
    import numpy as _np
except Exception:  # pragma: no cover - optional speed-up
    _np = None


def clean(data: bytes) -> str:
    """Bytes of one line → displayable text: the diagnosis's own cleaner (sources.lines.clean_text: the
    text its findings cite), tabs expanded. A line with neither ESC nor CR (most of them) is only
    decoded, what clean_text would do to it, without the call: the view cleans every row it draws."""
    text = data.decode("utf-8", "replace")
    if "\x1b" in text or "\r" in text:
        text = clean_text(text)
    return text.expandtabs(4)


def level_of(text: str) -> str | None:
    if LEVEL_ERROR.search(text):
        return "error"
    if LEVEL_WARNING.search(text):
        return "warning"
    return None


def merged(found: Iterable[int], extra: Sequence[int]) -> Iterator[int]:
    """Two ascending sequences of line numbers as one, ascending, each number once; `extra` is merged
    in as `found` (a scan) passes its numbers, what is left of it after the scan ends."""
    k = 0
    for line in found:
        while k < len(extra) and extra[k] <= line:
            if extra[k] < line:
                yield extra[k]
            k += 1
        yield line
    yield from extra[k:]


def _newlines(block: bytes, base: int) -> array:
    """Offsets just after every b"\\n" in block, shifted by base."""
    if _np is not None:
        pos = _np.flatnonzero(_np.frombuffer(block, dtype=_np.uint8) == 10)
        out = array("Q")
        out.frombytes((pos + (base + 1)).astype(_np.uint64).tobytes())
        return out
    out = array("Q")
    find = block.find
    i = find(b"\n")
    while i >= 0:
        out.append(base + i + 1)
        i = find(b"\n", i + 1)
    return out


class _Literal:
    """A case-insensitive (ASCII) literal with the `finditer` the scanner uses.

    The block is searched for every case variant of a window of at most 4 bytes of the needle (the
    window with the fewest letters: at most 16 variants) by Aho-Corasick, which runs at memory speed
    and releases the interpreter lock, so the screen stays live during a search; each candidate is then
    checked against the whole needle. Without ahocorasick_rs: bytes.lower() + find."""

    WINDOW = 4

    def __init__(self, needle: bytes, sample: bytes = b"") -> None:
        """`sample`: some of the text to search; its byte counts pick the rarest window (fewer
        candidates to check, and the automaton's prefilter skips faster)."""
        self.needle = needle.lower()
        self._ac, self._at, self._overlapping = None, 0, True
        if len(self.needle) > 0:
            try:
                import ahocorasick_rs
            except ImportError:  # pragma: no cover - a dependency of the engine
                return
            n, w = len(self.needle), min(self.WINDOW, len(self.needle))
            low = sample.lower()
            # The automaton's SIMD prefilter stops at every place its patterns' first bytes occur:
            # the window whose leading 2 and 3 bytes are rarest in the sample is searched fastest.
            self._at = min(range(n - w + 1), key=lambda i: (
                low.count(self.needle[i:i + 3]), low.count(self.needle[i:i + 2]),
                sum(c in _LETTERS for c in self.needle[i:i + w])))
            window = self.needle[self._at:self._at + w]
            # A window that cannot overlap itself is found by the faster non-overlapping search
            # without missing a candidate.
            self._overlapping = any(window[k:] == window[:w - k] for k in range(1, w))
            variants = {b""}
            for c in window:
                forms = {bytes([c]), bytes([c]).upper()}
                variants = {v + f for v in variants for f in forms}
            self._ac = ahocorasick_rs.BytesAhoCorasick(sorted(variants))

    def finditer(self, block: bytes):
        needle = self.needle
        if self._ac is None:
            low, pos = block.lower(), 0
            while (i := low.find(needle, pos)) >= 0:
                yield _Hit(i)
                pos = i + 1
            return
        at, n = self._at, len(needle)
        for _, start, _ in self._ac.find_matches_as_indexes(block, overlapping=self._overlapping):
            i = start - at
            if i >= 0 and block[i:i + n].lower() == needle:
                yield _Hit(i)


_LETTERS = frozenset(b"abcdefghijklmnopqrstuvwxyz")


class _Hit:
    __slots__ = ("_start",)

    def __init__(self, start: int) -> None:
        self._start = start

    def start(self) -> int:
        return self._start


class LogIndex:
    def __init__(self, path: str) -> None:
        self.path = path
        self.starts = array("Q", [0])     # starts[i] = byte offset of line i (0-based)
        self.indexed = 0                  # bytes indexed so far
        self.size = 0                     # file size at the last look
        self.done = False                 # reached the end of the file at least once
        self.error: str | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, str] = OrderedDict()
        self._fh = None
        self._stop = threading.Event()
        try:
            self.size = os.path.getsize(path)
        except OSError as exc:
            self.error = exc.strerror or str(exc)

    # ---- building -------------------------------------------------------------------------------
    def build(self, progress: Callable[[], None] | None = None, chunk: int = BLOCK) -> int:
        """Index from where the last call stopped to the current end of the file. Returns new lines."""
        added = 0
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.indexed)
                while not self._stop.is_set():
                    block = fh.read(chunk)
                    if not block:
                        break
                    offs = _newlines(block, self.indexed)
                    with self._lock:
                        # the line that was open (unterminated) may have grown: forget its cached text
                        self._cache.pop(len(self.starts) - 1, None)
                        self.starts.extend(offs)
                        self.indexed += len(block)
                        self.size = max(self.size, self.indexed)
                    added += len(offs)
                    if progress:
                        progress()
        except OSError as exc:
            self.error = exc.strerror or str(exc)
        self.done = True
        return added

    def follow(self, on_growth: Callable[[], None], interval: float = 0.2) -> None:
        """Keep indexing as the file grows until stop() (run in a thread)."""
        while not self._stop.is_set():
            try:
                size = os.path.getsize(self.path)
            except OSError:
                size = self.indexed
            if size < self.indexed:          # truncated or replaced: start over
                with self._lock:
                    self.starts = array("Q", [0])
                    self.indexed = 0
                    self._cache.clear()
            if size != self.indexed:
                self.build()
                on_growth()
            self._stop.wait(interval)

    def stop(self) -> None:
        self._stop.set()
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None

    # ---- reading --------------------------------------------------------------------------------
    @property
    def line_count(self) -> int:
        """Lines seen so far (a last line without its newline counts)."""
        with self._lock:
            n = len(self.starts)
            return n - 1 if self.starts[-1] >= self.indexed else n

    def _span(self, i: int) -> tuple[int, int]:
        start = self.starts[i]
        end = self.starts[i + 1] - 1 if i + 1 < len(self.starts) else self.indexed
        return start, end

    def line(self, i: int) -> str:
        """Line i (0-based) as clean text; '' beyond the end."""
        cached = self._cache.get(i)
        if cached is not None:
            self._cache.move_to_end(i)
            return cached
        with self._lock:
            if i < 0 or i >= len(self.starts) or self.starts[i] >= self.indexed:
                return ""
            start, end = self._span(i)
        text = self._read(start, end)
        self._cache[i] = text
        if len(self._cache) > CACHE_LINES:
            self._cache.popitem(last=False)
        return text

    def lines(self, first: int, count: int) -> list[str]:
        return [self.line(i) for i in range(first, first + count)]

    def _read(self, start: int, end: int) -> str:
        try:
            if self._fh is None:
                self._fh = open(self.path, "rb")
            self._fh.seek(start)
            length = end - start
            data = self._fh.read(min(length, MAX_LINE_BYTES))
        except (OSError, ValueError):
            return ""
        text = clean(data)
        return text + " …" if length > MAX_LINE_BYTES else text

    def line_at(self, offset: int) -> int:
        """0-based line containing byte `offset`."""
        with self._lock:
            return max(0, bisect.bisect_right(self.starts, offset) - 1)

    # ---- searching ------------------------------------------------------------------------------
    def _wait_indexed(self, offset: int) -> None:
        while self.indexed < offset and not self.done and not self._stop.is_set():
            self._stop.wait(0.02)

    def scan(self, pattern: re.Pattern, first: int = 0, stop: threading.Event | None = None,
             chunk: int = BLOCK) -> Iterator[int]:
        """0-based numbers of lines from `first` on whose text matches `pattern` (a bytes regex).
        Blocks start small and grow to `chunk`, so a hit near `first` comes at once."""
        with self._lock:
            if first >= len(self.starts):
                return
            pos = self.starts[first]
        last, size = -1, min(chunk, FIRST_BLOCK)
        try:
            fh = open(self.path, "rb")
        except OSError:
            return
        with fh:
            while not (stop is not None and stop.is_set()):
                self._wait_indexed(pos + 1)
                limit = self.indexed
                if pos >= limit:
                    return
                fh.seek(pos)
                block = fh.read(min(size, limit - pos))
                size = min(chunk, size * 4)
                if not block:
                    return
                cut = block.rfind(b"\n") + 1
                if cut == 0:
                    if size < chunk and pos + len(block) < limit:
                        size = chunk     # a line longer than the small first block: read it whole
                        continue
                    cut = len(block)     # one giant line, or the unterminated last line
                block = block[:cut]
                for m in pattern.finditer(block):
                    line = self.line_at(pos + m.start())
                    if line != last:
                        last = line
                        yield line
                pos += cut

    def _sample(self, size: int = FIRST_BLOCK) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                return fh.read(min(size, self.indexed))
        except OSError:
            return b""

    def search(self, text: str, first: int, backwards: bool = False,
               stop: threading.Event | None = None) -> int | None:
        """Next line (0-based, after `first`, wrapping) containing `text`, case-insensitive."""
        if not text:
            return None
        pattern = _Literal(text.encode("utf-8", "replace"), self._sample())
        total = self.line_count
        if total == 0:
            return None
        if not backwards:
            for line in self.scan(pattern, first + 1, stop):
                return line
            for line in self.scan(pattern, 0, stop):
                return line if line <= first else None
            return None
        best = None
        for line in self.scan(pattern, 0, stop):   # backwards: the last hit before `first`
            if line >= first:
                if best is not None:
                    return best
                break
            best = line
        if best is not None:
            return best
        for line in self.scan(pattern, first + 1, stop):
            best = line
        return best

    def problems(self, stop: threading.Event | None = None, first: int = 0) -> Iterator[int]:
        return self.scan(PROBLEM, first, stop)
