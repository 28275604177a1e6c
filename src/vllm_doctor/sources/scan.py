"""Chunked scanning of byte streams (files, stdin, a child's output) in bounded memory.

Almost every line of a vLLM log matches nothing, so the scanner never decodes them: an Aho-Corasick
automaton over the rules' literals finds candidate lines in large binary blocks, and only those are
parsed and handed to the diagnoser. While a traceback is open the diagnoser asks for every line
(`needs_context`), since frames and exception tails carry no literal.
"""
from __future__ import annotations

from typing import BinaryIO, Callable, Iterator

from vllm_doctor.sources.lines import Line, parse_line

BLOCK = 1 << 20
# The Rust automaton keeps its SIMD prefilter only for small pattern sets; several automata of at most
# this many literals each scan faster together than one automaton over all of them (bench/scan_bench.py).
GROUP = 64


def build_automata(literals: list[str]):
    """Stage-1 automata: a line containing any literal is a candidate. Blanks around a long literal are
    dropped (a space-led literal makes the prefilter fire on every word); the engine re-checks exactly."""
    import ahocorasick_rs

    coarse = sorted({lit.strip() if len(lit.strip()) >= 8 else lit for lit in literals})
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
        if not chunk:
            return
        self.bytes += len(chunk)
        data = self._carry + chunk if self._carry else chunk
        end = data.rfind(b"\n") + 1
        if end == 0:
            self._carry = data
            if len(self._carry) > 4 * BLOCK:     # a giant line with no newline: look at it in pieces
                self._scan(self._carry + b"\n", partial=True)
                self._carry = b""
            return
        self._carry = data[end:]
        self._scan(data[:end] if end < len(data) else data)

    def close(self) -> None:
        if self._carry:
            self._scan(self._carry + b"\n", partial=True)
            self._carry = b""

    def _scan(self, data: bytes, partial: bool = False) -> None:
        pos = 0                                  # start of the first line not yet accounted for
        lineno = self.lineno
        sink = self.sink
        size = len(data)
        find = data.find
        while pos < size:
            if sink.needs_context:
                nl = find(b"\n", pos)
                lineno += 1
                sink.feed(parse_line(data[pos:nl], self.source, lineno))
                pos = nl + 1
                continue
            hit = self._next_hit(data, pos)
            if hit < 0:
                lineno += data.count(b"\n", pos)
                break
            start = max(pos, data.rfind(b"\n", pos, hit) + 1)
            lineno += data.count(b"\n", pos, start) + 1
            nl = find(b"\n", hit)
            sink.feed(parse_line(data[start:nl], self.source, lineno))
            pos = nl + 1
        self.lineno = lineno if not partial else lineno

    def _next_hit(self, data: bytes, pos: int) -> int:
        # One automaton pass per region between context runs; matches come sorted by position.
        cache = getattr(self, "_hits", None)
        if cache is None or cache[0] is not data:
            starts = [m[1] for ac in self._automata for m in ac.find_matches_as_indexes(data)]
            if len(self._automata) > 1:
                starts.sort()
            self._hits = cache = (data, starts, 0)
        _, hits, i = cache
        while i < len(hits) and hits[i] < pos:
            i += 1
        self._hits = (data, hits, i)
        return hits[i] if i < len(hits) else -1


def read_blocks(stream: BinaryIO, size: int = BLOCK) -> Iterator[bytes]:
    while True:
        block = stream.read(size)
        if not block:
            return
        yield block


def scan_stream(stream: BinaryIO, scanner: Scanner, on_block: Callable[[bytes], None] | None = None) -> None:
    for block in read_blocks(stream):
        if on_block is not None:
            on_block(block)
        scanner.feed(block)
    scanner.close()


def iter_lines(data: bytes, source: str = "") -> Iterator[Line]:
    """Every line of a small buffer, parsed (tests and the TUI use this; the scanner does not)."""
    for i, raw in enumerate(data.split(b"\n"), 1):
        if raw or i == 1:
            yield parse_line(raw, source, i)
