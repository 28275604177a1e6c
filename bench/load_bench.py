"""The doctor on hostile logs: many repetitions, very many matching lines, pipe vs file.

1. On a crash-loop log (a real failing start-up repeated to --crash-size, gen_log.py) and on --flood-lines
   NCCL WARN lines: `python -m vllm_doctor --no-live --format json LOG` vs `LC_ALL=C grep -E -c -f
   patterns.txt LOG` (scan_bench.py's patterns), interleaved. Targets: the doctor's peak RSS < 100 MB
   and its CPU within 3x grep's.
2. On a normal start-up followed by N NCCL WARN lines, N in --repeat-lines: pipe mode
   `cat LOG | python -m vllm_doctor --no-live > /dev/null` vs file mode `python -m vllm_doctor --no-live
   LOG > /dev/null`, all sizes and both modes interleaved: the doctor process's CPU s, wall, peak RSS;
   CPU per 100k lines (flat = linear), and pipe / file at the largest N (target <= 1.5x).

Figures are medians over --rounds rounds.

    python bench/load_bench.py [--crash-size 200M] [--flood-lines 1M] [--repeat-lines 100k,200k,300k] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log
from compare import Command, interleave, ratio, stderr_progress, warm
from scan_bench import C_ENV, count_findings, write_patterns

DOCTOR = [sys.executable, "-m", "vllm_doctor", "--no-live"]
MB = 1e6 / 2**20          # MiB per MB


def against_grep(title: str, log: str, patterns: str, rounds: int) -> None:
    doctor = Command("vllm-doctor --format json", DOCTOR + ["--format", "json", log], C_ENV)
    grep = Command("grep -E -c -f patterns.txt", ["grep", "-E", "-c", "-f", patterns, log], C_ENV)
    warm(log)
    got = interleave([doctor, grep], rounds, stderr_progress)
    d, g = got[doctor.name], got[grep.name]
    print(f"\n== {title}: {os.path.getsize(log) / 2**20:,.0f} MiB, {gen_log.count_lines(log):,} lines")
    print(f"{'tool':28s} {'wall s':>8s} {'CPU s':>7s} {'peak RSS MiB':>13s}  result")
    print(f"{doctor.name:28s} {d.wall:8.2f} {d.cpu:7.2f} {d.rss_mib:13.1f}  "
          f"exit {d.last.rc}, {count_findings(d.last.out)} finding(s)")
    print(f"{grep.name:28s} {g.wall:8.2f} {g.cpu:7.2f} {g.rss_mib:13.1f}  "
          f"{g.last.out.decode(errors='replace').strip()} matching lines")
    print(f"doctor CPU / grep CPU: {ratio(d.cpu, g.cpu)} (target <= 3x); wall: {ratio(d.wall, g.wall)}; "
          f"doctor peak RSS {d.rss_mib / MB:.0f} MB (target < 100 MB)")


def pipe_vs_file(counts: list[int], rounds: int) -> None:
    logs = {n: gen_log.cached_scenario("nccl-repeat", n) for n in counts}
    cmds = []
    for n, log in logs.items():
        cmds.append(Command(f"file {n}", DOCTOR + [log], C_ENV, stdout="devnull"))
        cmds.append(Command(f"pipe {n}", DOCTOR, C_ENV, feed=["cat", log], stdout="devnull"))
    warm(*logs.values())
    got = interleave(cmds, rounds, stderr_progress)
    print("\n== normal start-up + N NCCL WARN lines: pipe (cat LOG | doctor) vs file (doctor LOG)")
    print(f"{'N lines':>9s} {'mode':>5s} {'wall s':>8s} {'CPU s':>7s} {'CPU s/100k':>11s} {'peak RSS MiB':>13s} {'exit':>5s}")
    for n in counts:
        for mode in ("file", "pipe"):
            s = got[f"{mode} {n}"]
            print(f"{n:9,d} {mode:>5s} {s.wall:8.2f} {s.cpu:7.2f} {s.cpu / n * 100_000:11.2f} {s.rss_mib:13.1f} "
                  f"{s.last.rc:5d}")
    top = counts[-1]
    f, p = got[f"file {top}"], got[f"pipe {top}"]
    print(f"pipe / file at {top:,} lines: CPU {ratio(p.cpu, f.cpu)}, wall {ratio(p.wall, f.wall)} (target <= 1.5x)")
    if len(counts) > 1:
        lo = counts[0]
        for mode in ("file", "pipe"):
            a, b = got[f"{mode} {lo}"].cpu / lo, got[f"{mode} {top}"].cpu / top
            print(f"{mode} mode CPU per line at {top:,} vs {lo:,}: {ratio(b, a)} (1x = linear)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crash-size", default="200M", help="size of the crash-loop log ('' to skip)")
    ap.add_argument("--flood-lines", default="1M", help="NCCL WARN lines of the flood log ('' to skip)")
    ap.add_argument("--repeat-lines", default="100k,200k,300k",
                    help="NCCL WARN line counts after a start-up, for pipe vs file ('' to skip)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"{args.rounds} interleaved rounds; figures are medians")
    patterns = None
    if args.crash_size or args.flood_lines:
        patterns, n_conv, n_skip = write_patterns(tempfile.mkdtemp(prefix="vllm-doctor-load-"), "grep")
        print(f"patterns.txt: {n_conv} catalog regexes as ERE, {n_skip} left out")
    if args.crash_size:
        size = gen_log.parse_size(args.crash_size)
        against_grep(f"crash-loop {args.crash_size}", gen_log.cached_scenario("crash-loop", size), patterns,
                     args.rounds)
    if args.flood_lines:
        n = gen_log.parse_count(args.flood_lines)
        against_grep(f"{n:,} NCCL WARN lines", gen_log.cached_scenario("nccl-flood", n), patterns, args.rounds)
    counts = sorted(gen_log.parse_count(c) for c in args.repeat_lines.split(",") if c)
    if counts:
        pipe_vs_file(counts, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
