"""A dangling `Traceback (most recent call last):` never keeps the rest of a log on the slow path, and a
traceback's frames are bounded."""
from pathlib import Path

from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.events.tracebacks import MAX_FRAMES, MAX_LINES, MAX_STRAY, TracebackAssembler
from vllm_doctor.sources.lines import parse_line
from vllm_doctor.sources.scan import Scanner

ROOT = Path(__file__).resolve().parent.parent
# An unprefixed vLLM 0.6.1 start-up: every `INFO …` line has the same process key, so the assembler's
# other-process idle bound never applies to them.
PLAIN = ROOT / "logs_corpus/healthy/v061-tp4-nccl-info.log"
# A real traceback (logs_corpus/real032/r04-tp5-40heads-8kv-assert.log shape: frames, code, exception).
REAL_TB = [
    "Traceback (most recent call last):",
    '  File "/opt/venv/bin/vllm", line 8, in <module>',
    "    sys.exit(main())",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/config/parallel.py", line 420, in __post_init__',
    "    assert self.world_size % self.tensor_parallel_size == 0",
    "AssertionError",
]


def info_lines() -> list[str]:
    lines = [ln for ln in PLAIN.read_text(encoding="utf-8", errors="replace").splitlines()
             if ln.startswith("INFO ")]
    assert len(lines) > 5
    return lines


def test_dangling_header_is_given_up_after_a_bound_of_own_lines():
    asm = TracebackAssembler()
    asm.feed(parse_line("Traceback (most recent call last):", 1))
    assert asm.busy
    lines = info_lines()
    for i in range(MAX_STRAY + 1):
        asm.feed(parse_line(lines[i % len(lines)], i + 2))
    assert not asm.busy, "a header with no frames must not stay open over the rest of the log"
    assert asm.finished and asm.finished[-1].exc_type is None        # kept, as a cut traceback
    # and a real traceback after it still assembles whole
    for i, text in enumerate(REAL_TB):
        asm.feed(parse_line(text, 1000 + i))
    asm.close()
    assert asm.finished[-1].exc_type == "AssertionError" and len(asm.finished[-1].frames) == 2


def test_frames_and_lines_of_one_traceback_are_bounded():
    asm = TracebackAssembler()
    asm.feed(parse_line(REAL_TB[0], 1))
    n = 0
    for i in range(MAX_LINES // 2 - 1):         # frame + code pairs: never stray, still bounded
        asm.feed(parse_line(f'  File "/opt/venv/lib/python3.11/site-packages/vllm/x.py", line {i}, in f{i}', 2 + n))
        asm.feed(parse_line("    return f(x)", 3 + n))
        n += 2
    (tb,) = asm.open.values()
    assert len(tb.frames) == MAX_FRAMES and tb.frames_dropped == MAX_LINES // 2 - 1 - MAX_FRAMES
    assert tb.frames[0].func == "f0" and tb.frames[-1].func == f"f{MAX_LINES // 2 - 2}"   # both ends kept
    for i in range(10):
        asm.feed(parse_line("    return f(x)", 10_000 + i))
    assert not asm.busy, "an open traceback takes at most MAX_LINES lines"


class Counter:
    """A Diagnoser that counts the lines the scanner hands it (the slow path)."""

    def __init__(self, catalog) -> None:
        self.d = Diagnoser(catalog)
        self.fed = 0

    @property
    def needs_context(self):
        return self.d.needs_context

    def feed(self, line, key=None):
        self.fed += 1
        self.d.feed(line)


def slow_path_lines(catalog, data: bytes) -> int:
    sink = Counter(catalog)
    scanner = Scanner(sink.d.scan_literals, sink, source="x")
    scanner.feed(data)
    scanner.close()
    return sink.fed


def test_dangling_header_costs_a_bounded_number_of_slow_lines(catalog):
    lines = info_lines()
    body = [f"{lines[i % len(lines)]} #{i}" for i in range(20_000)]      # distinct lines: no repeat cache
    plain = ("\n".join(body) + "\n").encode()
    dangling = b"Traceback (most recent call last):\n" + plain
    extra = slow_path_lines(catalog, dangling) - slow_path_lines(catalog, plain)
    assert extra <= MAX_STRAY + 2, f"{extra} more lines took the slow path after a dangling header"
