"""How long the triage TUI takes to show a usable screen on a big log (target: < 2 s for 1 GB).

Writes a synthetic vLLM log of --size MiB (default 1024) made of real start-up lines with a failure at
the end, opens the app headless at 80x24 and prints: time to the first rendered log rows (usable screen),
time for a jump to the last line, a search hit near the end, the full index and the diagnosis, and the
process's peak memory. Usage: python bench/tui_open_bench.py [--size MiB] [--keep PATH]
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


async def measure(path: Path) -> dict:
    from vllm_doctor.diagnose import Options
    from vllm_doctor.rules.catalog import cached_catalog
    from vllm_doctor.tui.app import TriageApp
    from vllm_doctor.tui.logview import LogView

    out = {}
    t0 = time.perf_counter()
    app = TriageApp([str(path)], cached_catalog(None), Options(live=False))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        lv = app.query_one(LogView)
        while lv.rows < 22:
            await asyncio.sleep(0.005)
        await pilot.pause()
        out["usable screen (first 22 rows shown)"] = time.perf_counter() - t0
        while not app.index.done:
            await asyncio.sleep(0.01)
        out["full line index"] = time.perf_counter() - t0
        t = time.perf_counter()
        app.goto_line(app.index.line_count)
        await pilot.pause()
        out["jump to the last line"] = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(50):
            lv.scroll_to(y=(lv.scroll_y + 997) % max(1, lv.rows), animate=False, immediate=True)
            await pilot.pause()
        out["scroll: 50 far jumps, each"] = (time.perf_counter() - t) / 50
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
        result = asyncio.run(measure(path))
    finally:
        if not args.keep:
            os.unlink(path)
    print(f"log: {path.stat().st_size / 2**20 if path.exists() else args.size:.0f} MiB, {result.pop('lines'):,} lines")
    for name, seconds in result.items():
        print(f"  {name:<40} {seconds:8.3f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  {'peak RSS':<40} {rss:8.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
