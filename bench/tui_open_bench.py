"""How long the triage TUI takes to show a usable screen on a big log (target: < 2 s for 1 GB).

Writes a synthetic vLLM log of --size MiB (default 1024) made of real start-up lines with a failure at
the end, opens the app headless at 80x24 and prints: the time to the first frame with log rows (the
usable screen), a jump to the last line and far scroll jumps (time until the frame at the new offset is
rendered), a search hit near the end, the full index and the diagnosis, and the peak memory of the app
and of the diagnosis process. Usage: python bench/tui_open_bench.py [--size MiB] [--keep PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOG = (HERE.parent / "tests" / "tui" / "data" / "tp3-40heads.log")


def make_log(path: Path, mib: int) -> None:
    lines = LOG.read_bytes().splitlines(keepends=True)
    head, body, tail = b"".join(lines[:13]), b"".join(
        l for l in lines[2:13] if b"INFO" in l or b"WARNING" in l), b"".join(lines[13:])
    filler = (b"(APIServer pid=30416) INFO 12-01 00:31:30 [loggers.py:123] Engine 000: Avg prompt throughput: "
              b"0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs\n") * 200 + body
    target = mib << 20
    with open(path, "wb") as out:
        out.write(head)
        written = len(head)
        while written < target:
            out.write(filler)
            written += len(filler)
        out.write(b"NEEDLE near the end\n")
        out.write(tail)


class FrameClock:
    """Wraps LogView.render_line to note when a frame's last row was rendered, and at which scroll
    offset: the time a screen is on the terminal, not Pilot's idle waits (Pilot waits until the whole
    process stops using CPU, up to 1 s a step, which any busy thread stretches)."""

    def __init__(self, LogView) -> None:
        self.frames: list[tuple[float, int]] = []
        original = LogView.render_line
        clock = self

        def render_line(view, y):
            strip = original(view, y)
            if y == view.size.height - 1 and view.rows > y:
                clock.frames.append((time.perf_counter(), int(view.scroll_y)))
            return strip

        LogView.render_line = render_line

    async def wait(self, since: float, scroll_y: int | None = None, timeout: float = 60) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            for t, y in self.frames:
                if t >= since and (scroll_y is None or y == scroll_y):
                    return t
            await asyncio.sleep(0.001)
        raise TimeoutError("no frame")


async def measure(path: Path, t_start: float) -> dict:
    t = time.perf_counter()
    from vllm_doctor.diagnosis.saved import Options
    from vllm_doctor.rules.catalog import cached_catalog
    from vllm_doctor.tui.app import TriageApp
    from vllm_doctor.tui.logview import LogView

    out = {"imports (textual, the app, the catalog)": time.perf_counter() - t}
    clock = FrameClock(LogView)
    t0 = time.perf_counter()
    app = TriageApp([str(path)], cached_catalog(None), Options(live=False))
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_tab("log")                     # the key '5', without Pilot's idle wait
        lv = app.query_one(LogView)
        shown = await clock.wait(t0)
        out["usable screen: first frame of log rows"] = shown - t0
        out["  same, from the start of the process"] = shown - t_start
        await pilot.press("5")
        out["  Pilot: '5' pressed and the process idle"] = time.perf_counter() - t0
        while not app.index.done:
            await asyncio.sleep(0.01)
        out["full line index"] = time.perf_counter() - t0
        t = time.perf_counter()
        app.goto_line(app.index.line_count)
        await clock.wait(t, int(lv.scroll_y))
        out["jump to the last line (frame shown)"] = time.perf_counter() - t
        jumps = []
        for _ in range(50):
            t = time.perf_counter()
            y = int((lv.scroll_y + 99_997) % max(1, lv.max_scroll_y))
            lv.scroll_to(y=y, animate=False, immediate=True)
            await clock.wait(t, y)
            jumps.append(time.perf_counter() - t)
        jumps.sort()
        out["scroll: far jump to a frame, median of 50"] = jumps[len(jumps) // 2]
        out["scroll: far jump to a frame, worst of 50"] = jumps[-1]
        t = time.perf_counter()
        line = app.index.search("NEEDLE", 0)
        out["search to a hit at the end"] = time.perf_counter() - t
        assert line is not None
        while not app.final:
            await asyncio.sleep(0.05)
        out["diagnosis (root cause: %s)" % (app.findings[0].rule if app.findings else "none")] = \
            time.perf_counter() - t0
        out["lines"] = app.index.line_count
    return out


def main() -> int:
    t_start = time.perf_counter()
    os.environ["CI"] = "1"          # no scan progress bar on stderr while the app is measured
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=1024, help="log size in MiB")
    ap.add_argument("--keep", help="write the log here (and reuse it if it exists)")
    args = ap.parse_args()
    path = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / "big.log"
    if not path.exists():
        t = time.perf_counter()
        make_log(path, args.size)
        print(f"wrote {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    try:
        result = asyncio.run(measure(path, t_start))
    finally:
        if not args.keep:
            os.unlink(path)
    print(f"log: {path.stat().st_size / 2**20 if path.exists() else args.size:.0f} MiB, {result.pop('lines'):,} lines")
    for name, seconds in result.items():
        print(f"  {name:<40} {seconds:8.3f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  {'peak RSS (the app)':<40} {rss:8.0f} MiB")
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if child:
        print(f"  {'peak RSS (diagnosis process)':<40} {child:8.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
