"""Chunked scanning of byte streams (files, stdin, a child's output) in bounded memory.

Almost every line of a vLLM log matches nothing, so the scanner never decodes them: an Aho-Corasick
automaton over the rules' literals finds candidate lines in large binary blocks, and only those are
parsed and handed to the diagnoser. While a traceback is open the diagnoser asks for every line
(`needs_context`), since frames and exception tails carry no literal.
"""
from __future__ import annotations

import os
from typing import BinaryIO, Iterator

from vllm_doctor.sources.lines import parse_line

BLOCK = 4 << 20   # large blocks: fewer hand-offs to the automata threads (bench: 4 MiB beat 1 and 8)
# The Rust automaton keeps its SIMD prefilter only for small pattern sets; several automata of at most
# this many literals each scan faster together than one automaton over all of them (bench/scan_bench.py).
GROUP = 64
# The automata release the GIL: a big block is cut into one part per core (at most four), each looked at
# by every automaton in a worker thread. Small blocks (most of a pipe's reads) are not worth a hand-off.
PARALLEL_MIN = 256 << 10
NUMPY_MIN = 64 << 10      # below this, bytes.count beats numpy's set-up cost
_POOL = None
_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))


def _pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=_POOL_SIZE, thread_name_prefix="vllm-doctor-scan")
    return _POOL


def _look(automata, data: bytes, start: int, end: int) -> tuple[list[int], int]:
    """Start offsets of the literal hits in data[start:end] and its newline count (run in a worker:
    the automata and numpy leave the GIL, so the parts of a block are looked at in parallel)."""
    view = memoryview(data)[start:end]
    hits = [start + m[1] for ac in automata for m in ac.find_matches_as_indexes(view)]
    return hits, count_newlines(data, start, end)


_NUMPY = None


def count_newlines(data: bytes, pos: int, end: int) -> int:
    """Newlines in data[pos:end]. On a big block numpy counts about 3x faster than bytes.count and,
    unlike it, releases the GIL, so the automata threads are not held up (bench/scan_bench.py)."""
    global _NUMPY
    if end - pos < NUMPY_MIN:
        return data.count(b"\n", pos, end)
    if _NUMPY is None:
        try:
            import numpy
        except ImportError:          # numpy comes with transformers; stay correct without it
            numpy = False
        _NUMPY = numpy
    if _NUMPY is False:
        return data.count(b"\n", pos, end)
    view = _NUMPY.frombuffer(data, dtype=_NUMPY.uint8, count=end - pos, offset=pos)
    return int(_NUMPY.count_nonzero(view == 10))


def build_automata(literals: list[str]):
    """Stage-1 automata: a line containing any literal is a candidate. Blanks around a long literal are
    dropped (a space-led literal makes the prefilter fire on every word); the engine re-checks exactly."""
    import ahocorasick_rs

    coarse = {lit.strip() if len(lit.strip()) >= 8 else lit for lit in literals}
    # a literal holding another one adds nothing (a line with `404 Client Error: ...` has `Error: `), and
    # every literal costs the prefilter: keep the shortest of each such family
    coarse = sorted(lit for lit in coarse if not any(other != lit and other in lit for other in coarse))
    return [ahocorasick_rs.BytesAhoCorasick([lit.encode() for lit in coarse[i:i + GROUP]],
                                            matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
            for i in range(0, len(coarse), GROUP)]


class Scanner:
    def __init__(self, literals: list[str], sink, source: str = "") -> None:
        """`sink` has `feed(Line)` and a `needs_context` property (the Diagnoser)."""
        self._automata = build_automata(literals)
        self.sink = sink
        self.source = source
        self.lineno = 0          # lines fully consumed so far
        self.bytes = 0
        self._carry = b""

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

    def _scan(self, data: bytes, pos: int, end: int) -> None:
        """The lines of data[pos:end] (which ends with a newline); bytes outside are not looked at."""
        lineno = self.lineno
        sink = self.sink
        source = self.source
        find = data.find
        hits: list[int] | None = None
        i = 0
        if not sink.needs_context and end - pos >= PARALLEL_MIN:
            # the usual block: nothing in it. Its parts (cut at newlines, which no literal spans) are
            # looked at side by side, each by every automaton, so the cores share the work evenly.
            parts = _POOL_SIZE
            cuts = [pos]
            for k in range(1, parts):
                cut = find(b"\n", pos + (end - pos) * k // parts, end) + 1
                if cut > cuts[-1]:
                    cuts.append(cut)
            if cuts[-1] < end:
                cuts.append(end)
            futures = [_pool().submit(_look, self._automata, data, a, b) for a, b in zip(cuts, cuts[1:])]
            hits, total = [], 0
            for future in futures:
                part_hits, part_lines = future.result()
                hits += part_hits
                total += part_lines
            if not hits:
                self.lineno = lineno + total
                return
            hits.sort()
        while pos < end:
            if sink.needs_context:
                nl = find(b"\n", pos, end)
                lineno += 1
                sink.feed(parse_line(data[pos:nl], source, lineno))
                pos = nl + 1
                continue
            if hits is None:
                hits = self._hits(data)
            n = len(hits)
            while i < n and hits[i] < pos:
                i += 1
            if i == n or hits[i] >= end:
                lineno += count_newlines(data, pos, end)
                break
            hit = hits[i]
            start = max(pos, data.rfind(b"\n", pos, hit) + 1)
            lineno += data.count(b"\n", pos, start) + 1
            nl = find(b"\n", hit, end)
            sink.feed(parse_line(data[start:nl], source, lineno))
            pos = nl + 1
        self.lineno = lineno

    def _hits(self, data: bytes) -> list[int]:
        """Start offsets of the literal matches in a block, sorted (one pass per automaton)."""
        automata = self._automata
        if len(automata) == 1:
            return [m[1] for m in automata[0].find_matches_as_indexes(data)]
        starts = [m[1] for ac in automata for m in ac.find_matches_as_indexes(data)]
        starts.sort()
        return starts


def read_blocks(stream: BinaryIO, size: int = BLOCK) -> Iterator[bytes]:
    """The stream's blocks, the next one read while the caller scans this one (a read leaves the GIL;
    on a big file this keeps the automata busy instead of waiting on the disk or page cache)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-doctor-read") as reader:
        pending = reader.submit(stream.read, size)
        while True:
            block = pending.result()
            if not block:
                return
            pending = reader.submit(stream.read, size)
            yield block
