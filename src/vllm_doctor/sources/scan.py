"""Chunked scanning of byte streams (files, stdin, a child's output) in bounded memory.

Almost every line of a vLLM log matches nothing, so the scanner never decodes them: Aho-Corasick automata
over the rules' literals find candidate lines in large binary blocks (in worker threads: the automata
leave the GIL), and only those are parsed and handed to the sink (the diagnoser). While a traceback is
open the sink asks for every line (`needs_context`), since frames and exception tails carry no literal.

A line seen before (byte for byte, or with only its numbers changed) is not parsed again when the sink
says its outcome is known (`sink.repeats`, diagnosis/repeats.py): a flood of one NCCL warning costs a
dictionary look-up per line.
"""
from __future__ import annotations

import io
import os
import stat
from functools import lru_cache
from typing import BinaryIO, Iterator, Protocol

from vllm_doctor.sources.lines import Line, parse_line

BLOCK = 4 << 20   # large blocks: fewer hand-offs to the search threads (bench: 4 MiB beat 1 and 8)
GROUP = 64        # the most patterns one automaton keeps its SIMD prefilter for
# A big block is cut into one part per core (at most four), each searched in a worker thread (the
# automaton leaves the GIL) while this thread counts the block's newlines. Small blocks (most of a
# pipe's reads) are not worth a hand-off.
PARALLEL_MIN = 256 << 10
# Past this many bytes newlines are counted by numpy in the search threads (3x bytes.count, and off the
# GIL); a small log never pays numpy's import (bench/scan_bench.py, bench/startup_bench.py).
NUMPY_AFTER = 384 << 20
DENSE_MIN = 64 << 10    # a block this big whose lines nearly all hit makes the next one read line by line
_POOL = None
_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))
# a repeated line's key: its numbers zeroed (timestamps, counters), its process prefix kept as it is
ZERO_DIGITS = bytes.maketrans(b"123456789", b"000000000")
PREFIX_END = 160        # a process prefix (`(Worker_TP1 pid=2, ip=A)`) or NCCL host prefix ends before this


class Repeats(Protocol):
    """The sink's memory of lines whose outcome is known (diagnosis/repeats.RepeatCache): its entries
    have `seen(raw, lineno, source)`, called for each later copy of their line."""

    exact: dict          # the line's bytes -> entry
    numbers: dict        # number_key(bytes) -> entry
    source: str | None   # the source of the line the sink took last


class Sink(Protocol):
    needs_context: bool

    def feed(self, line: Line, key: tuple[bytes, bytes] | None = None): ...

    @property
    def repeats(self) -> Repeats | None: ...


def number_key(raw: bytes) -> bytes:
    """The line with its digits zeroed, but for the process or NCCL host prefix (kept verbatim: the pid,
    ip and host it names are facts of their own). A timestamp before an NCCL host prefix is zeroed too:
    `[2025-10-13 09:06:25] node-0:3663:4044 [0] … NCCL WARN …`."""
    cut = raw.find(b" NCCL ", 0, PREFIX_END)          # after `host:pid:tid [rank]` and any `(… pid=…)`
    if cut < 0:
        pid = raw.find(b"pid=", 0, PREFIX_END)
        if pid < 0:
            return raw.translate(ZERO_DIGITS)
        cut = raw.find(b")", pid) + 1
        return raw[:cut] + raw[cut:].translate(ZERO_DIGITS)
    lead = raw.find(b"] ", 0, cut) + 2 if raw[:1] == b"[" else 0
    if lead < 2 or b":" not in raw[lead:cut]:         # no `[time] host:…` shape: all of it is the prefix
        lead = 0
    return raw[:lead].translate(ZERO_DIGITS) + raw[lead:cut] + raw[cut:].translate(ZERO_DIGITS)


def _pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=_POOL_SIZE, thread_name_prefix="vllm-doctor-scan")
    return _POOL


def _submit(fn, automata, data: bytes, cuts: list[int]) -> list:
    """fn over each part data[cuts[i]:cuts[i+1]] in the search threads, as futures.

    The pool starts its threads in `submit`. A Ctrl-C that lands while it starts the first one leaves a
    thread that concurrent.futures' exit hook does not know of: exit would wait for it forever (about 2 %
    of Ctrl-Cs as a scan begins). So an interrupted submit shuts the pool down (its sentinel stops every
    thread of it, known or not), and the next scan makes a new one."""
    global _POOL
    pool = _pool()
    try:
        return [pool.submit(fn, automata, data, a, b) for a, b in zip(cuts, cuts[1:])]
    except BaseException:
        _POOL = None
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def _find(automata, data: bytes, start: int, end: int) -> list[int]:
    """Start offsets of the pattern hits in data[start:end] (run in a worker: the automata leave the GIL)."""
    view = memoryview(data)[start:end]
    return [start + m[1] for ac in automata for m in ac.find_matches_as_indexes(view)]


def _find_and_count(automata, data: bytes, start: int, end: int) -> tuple[list[int], int]:
    """_find, and the part's newlines counted by numpy (which also leaves the GIL)."""
    view = _NUMPY.frombuffer(data, dtype=_NUMPY.uint8, count=end - start, offset=start)
    return _find(automata, data, start, end), int(_NUMPY.count_nonzero(view == 10))


_NUMPY = None


def _numpy() -> bool:
    """numpy, imported once a big input makes its ~0.1 s worth it; False without it (bytes.count then)."""
    global _NUMPY
    if _NUMPY is None:
        try:
            import numpy
        except ImportError:
            numpy = False
        _NUMPY = numpy
    return _NUMPY is not False


def coarse_literals(literals: list[str]) -> list[str]:
    """The literals as the first pass needs them: blanks around a long literal dropped (a space-led one
    makes the prefilter fire on every word; the diagnoser re-checks exactly), and a literal that holds
    another one left out (a line with `404 Client Error: ...` has `Error: `)."""
    return list(_coarse(tuple(literals)))


@lru_cache(maxsize=8)
def _coarse(literals: tuple[str, ...]) -> tuple[str, ...]:
    # quadratic in the catalog's literals (~20 ms): worked out once per catalog, not once per scanner
    coarse = {lit.strip() if len(lit.strip()) >= 8 else lit for lit in literals}
    return tuple(sorted(lit for lit in coarse if not any(other != lit and other in lit for other in coarse)))


def build_automata(literals: list[str]):
    """Stage-1 automata: a line containing any literal is a candidate. The Rust automaton keeps its SIMD
    prefilter only for small pattern sets: several automata of at most GROUP literals each scan faster
    together than one over all of them (bench/scan_bench.py)."""
    import ahocorasick_rs

    coarse = coarse_literals(literals)
    return [ahocorasick_rs.BytesAhoCorasick([lit.encode() for lit in coarse[i:i + GROUP]],
                                            matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
            for i in range(0, len(coarse), GROUP)]


class Scanner:
    def __init__(self, literals: list[str], sink: Sink, source: str = "") -> None:
        self._automata = build_automata(literals)
        self.sink = sink
        self.source = source
        self.lineno = 0          # lines fully consumed so far
        self.bytes = 0
        self._carry = b""
        self._flooded = False       # the last block was mostly candidate lines (see _scan_flood)

    def feed(self, chunk: bytes) -> None:
        """Scan a block in place: the line left open by the previous block is completed and looked at on
        its own, the block's whole lines are scanned without copying the block, its open tail is kept."""
        if not chunk:
            return
        self.bytes += len(chunk)
        first = chunk.find(b"\n")
        if first < 0:
            self._carry += chunk
            if len(self._carry) > 4 * BLOCK:     # a giant line with no newline: look at it in pieces
                line, self._carry = self._carry + b"\n", b""
                self._scan(line, 0, len(line))
            return
        pos = 0
        if self._carry:
            line, self._carry = self._carry + chunk[:first + 1], b""
            self._scan(line, 0, len(line))
            pos = first + 1
        end = chunk.rfind(b"\n") + 1
        if pos < end:
            self._scan(chunk, pos, end)
        if end < len(chunk):
            self._carry = chunk[end:]

    def close(self) -> None:
        if self._carry:
            line, self._carry = self._carry + b"\n", b""
            self._scan(line, 0, len(line))

    def _repeats(self) -> Repeats | None:
        """The sink's known lines, when it has them and the last line it took was this source's."""
        repeats = getattr(self.sink, "repeats", None)
        return repeats if repeats is not None and repeats.source == self.source else None

    def _search(self, data: bytes, pos: int, end: int) -> tuple[list[int], int | None]:
        """(sorted hit offsets, the newline count of data[pos:end] or None when not counted)."""
        if end - pos < PARALLEL_MIN:
            hits = _find(self._automata, data, pos, end)
            if len(self._automata) > 1:
                hits.sort()
            return hits, None
        # the usual block: nothing in it. Its parts (cut at newlines, which no pattern spans) are
        # searched side by side while this thread counts the newlines (bytes.count needs the GIL, the
        # automata do not); on a big input numpy counts them in the search threads instead.
        cuts = [pos]
        for k in range(1, _POOL_SIZE):
            cut = data.find(b"\n", pos + (end - pos) * k // _POOL_SIZE, end) + 1
            if cut > cuts[-1]:
                cuts.append(cut)
        if cuts[-1] < end:
            cuts.append(end)
        hits: list[int] = []
        if self.bytes >= NUMPY_AFTER and _numpy():
            total = 0
            for future in _submit(_find_and_count, self._automata, data, cuts):
                part, lines = future.result()
                hits += part
                total += lines
        else:
            futures = _submit(_find, self._automata, data, cuts)
            total = data.count(b"\n", pos, end)
            for future in futures:
                hits += future.result()
        if len(self._automata) > 1:
            hits.sort()
        return hits, total

    def _scan(self, data: bytes, pos: int, end: int) -> None:
        """The lines of data[pos:end] (which ends with a newline); bytes outside are not looked at.

        The loop runs once per candidate line (a flood makes that a million times): what it calls is
        bound to locals, and the sink's state (needs_context, its known lines) is read again only after
        the sink took a line, the one thing that can change it."""
        sink = self.sink
        base = self.lineno
        context = sink.needs_context
        if self._flooded and not context and end - pos >= DENSE_MIN and self._repeats() is not None:
            self._scan_flood(data, pos, end)
            return
        hits, total = (None, None) if context else self._search(data, pos, end)
        if not context and not hits:
            self._flooded = False
            self.lineno = base + (total if total is not None else data.count(b"\n", pos, end))
            return
        if hits is not None and end - pos >= DENSE_MIN:
            lines = total if total is not None else data.count(b"\n", pos, end)
            self._flooded = len(hits) >= lines      # most lines hit: the next block is read line by line
        lineno, source, feed = base, self.source, sink.feed
        find, rfind, count = data.find, data.rfind, data.count
        exact, numbers = self._known()
        i, n = 0, (0 if hits is None else len(hits))
        while pos < end:
            if context:
                nl = find(b"\n", pos, end)
                lineno += 1
                feed(parse_line(data[pos:nl], source, lineno))
                pos = nl + 1
                context = sink.needs_context
                exact, numbers = self._known()
                continue
            if hits is None:
                hits, _ = self._search(data, pos, end)
                n, i = len(hits), 0
            while i < n and hits[i] < pos:
                i += 1
            if i == n:
                break
            hit = hits[i]
            i += 1
            start = rfind(b"\n", pos, hit) + 1 or pos
            if start != pos:
                lineno += count(b"\n", pos, start)
            lineno += 1
            nl = find(b"\n", hit, end)
            raw = data[start:nl]
            pos = nl + 1
            if exact is None:
                feed(parse_line(raw, source, lineno))
            else:
                entry = exact.get(raw)
                if entry is None:
                    key = number_key(raw)
                    entry = numbers.get(key)
                    if entry is None:
                        feed(parse_line(raw, source, lineno), (raw, key))
                if entry is not None:
                    entry.seen(raw, lineno, source)
                    continue
            context = sink.needs_context
            exact, numbers = self._known()
        if pos < end:
            lineno = base + total if total is not None else lineno + count(b"\n", pos, end)
        self.lineno = lineno

    def _scan_flood(self, data: bytes, pos: int, end: int) -> None:
        """A block in a flood, line by line: most lines are copies of known lines, and looking each up is
        cheaper than the automata's hits on it (several per line). An unknown line is searched on its own;
        when copies stop being most of the lines, the next block is searched as usual."""
        sink, source, automata = self.sink, self.source, self._automata
        lineno = self.lineno
        exact, numbers = self._known()
        context = False
        known = 0
        lines = data[pos:end].split(b"\n")
        lines.pop()                                     # data[pos:end] ends with a newline
        for raw in lines:
            lineno += 1
            if exact is None or context:
                if context or any(ac.find_matches_as_indexes(raw) for ac in automata):
                    sink.feed(parse_line(raw, source, lineno))
                    context = sink.needs_context
                    exact, numbers = self._known()
                continue
            entry = exact.get(raw)
            if entry is None:
                key = number_key(raw)
                entry = numbers.get(key)
                if entry is None:
                    if any(ac.find_matches_as_indexes(raw) for ac in automata):
                        sink.feed(parse_line(raw, source, lineno), (raw, key))
                        context = sink.needs_context
                        exact, numbers = self._known()
                    continue
            entry.seen(raw, lineno, source)
            known += 1
        self._flooded = known * 5 >= len(lines) * 4
        self.lineno = lineno

    def _known(self) -> tuple:
        """(exact, numbers) of the sink's known lines, or Nones (diagnosis/repeats.py)."""
        repeats = self._repeats()
        return (None, None) if repeats is None else (repeats.exact, repeats.numbers)


def read_blocks(stream: BinaryIO, size: int = BLOCK) -> Iterator[bytes]:
    """The stream's blocks, the next one read while the caller scans this one (a read leaves the GIL;
    on a big file this keeps the automata busy instead of waiting on the disk or page cache). A file of
    one block is read at once (no reading thread to start for a small log)."""
    try:
        info = os.fstat(stream.fileno())
        small = isinstance(stream, (io.BufferedReader, io.FileIO)) and stat.S_ISREG(info.st_mode) \
            and info.st_size < size
    except (AttributeError, OSError, ValueError):
        small = False
    if small:
        while block := stream.read(size):
            yield block
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-doctor-read") as reader:
        pending = reader.submit(stream.read, size)
        while True:
            block = pending.result()
            if not block:
                return
            pending = reader.submit(stream.read, size)
            yield block
