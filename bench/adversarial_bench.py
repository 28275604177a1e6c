"""Per rule, the worst time the doctor takes on a hostile line built from the rule's own examples.

The lines (`adversarial_lines`, which tests/test_regex_bounds.py uses too), SIZE characters each: an
example followed by spaces, the example less its last character repeated, its digits blown up to
thousands of digits, and spaces pushed in before its last character. Each line is its own log.

    --mode cli (default)  `vllm-doctor --no-live --format json LINE.log` per line: wall seconds less the
                          median of the same command on a one-line log without a rule's literal (start-up
                          and catalog load), run every 25 lines in between the measured ones
    --mode inprocess      the engine alone (parse, match, finish), in a forked child per line: CPU seconds

    --checkout DIR        another checkout's code and rules (e.g. `git archive HEAD | tar -x -C DIR`): the
                          figures from before a change, next to after
    --timeout S           a line still running after S seconds is stopped, counted as "> S"
    --rules a,b           only these rules; --examples N: the first N examples of each

Prints per rule: lines, the worst seconds, the construction and the example of the worst one; then the
rules over the 0.1 s target. A bench, not a test: it asserts nothing.

    python bench/adversarial_bench.py --mode inprocess
    python bench/adversarial_bench.py --rules cli-invalid-choice,no-gpu --timeout 20
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZE = 100_000
TARGET = 0.1
BASELINE_EVERY = 25
# a line that names no rule's literal: the CLI's cost of starting, loading the catalog and reporting
NO_OP = "INFO 05-01 12:00:00 [api_server.py:1] vLLM API server version 0.6.3"


def adversarial_lines(text: str, size: int = SIZE):
    """(construction, line) for one example line, each about `size` characters."""
    yield "spaces", text + " " * size
    stem = text[:-1] or text
    yield "repeat", (stem * (size // len(stem) + 1))[:size]
    runs = re.findall(r"\d+", text)
    if runs:
        width = max(1000, size // len(runs))
        yield "digits", re.sub(r"\d+", lambda m: (m.group() * (width // len(m.group()) + 1))[:width], text)
    yield "gap", text[:-1] + " " * size + text[-1:]


def rule_examples(rules_dir: Path, only: set[str], limit: int | None) -> dict[str, list[str]]:
    """Rule id -> its example lines, read from the TOML (no import: any checkout's rules)."""
    out = {}
    for path in sorted(rules_dir.glob("[!_]*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if only and data["id"] not in only:
            continue
        out[data["id"]] = [ex["text"] for ex in data.get("examples", [])][:limit]
    return out


# --------------------------------------------------------------------------- the CLI, one process a line
def _cli(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> float:
    start = time.perf_counter()
    try:
        subprocess.run(argv + [str(log)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return float("inf")
    return time.perf_counter() - start


def measure_cli(examples: dict[str, list[str]], checkout: Path, timeout: float, size: int):
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(checkout / "src"),
               VLLM_DOCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="adversarial-bench-cache-"))
    argv = [sys.executable, "-m", "vllm_doctor", "--no-live", "--format", "json", "--rules-dir",
            str(checkout / "rules")]
    work = Path(tempfile.mkdtemp(prefix="adversarial-bench-"))
    no_op, log = work / "no-op.log", work / "line.log"
    no_op.write_text(NO_OP + "\n")
    baseline = [_cli(argv, env, no_op, timeout) for _ in range(3)]     # the first one fills the cache
    raw: dict[str, list[tuple[float, str, str]]] = {}
    count = 0
    for rule_id, texts in examples.items():
        for text in texts:
            for kind, line in adversarial_lines(text, size):
                log.write_text(line + "\n")
                raw.setdefault(rule_id, []).append((_cli(argv, env, log, timeout), kind, text))
                count += 1
                if count % BASELINE_EVERY == 0:
                    baseline.append(_cli(argv, env, no_op, timeout))
        print(f"  .. {rule_id}", file=sys.stderr, flush=True)
    start = statistics.median(baseline[1:])
    print(f"no-op run (start-up, catalog, report): median {start:.3f} s over {len(baseline) - 1} runs")
    return {rule: [(t - start, kind, text) for t, kind, text in got] for rule, got in raw.items()}


# --------------------------------------------------------------------------- in process, one fork a line
def measure_inprocess(examples: dict[str, list[str]], checkout: Path, timeout: float, size: int):
    sys.path.insert(0, str(checkout / "src"))
    sys.set_int_max_str_digits(0)        # the engine is measured, not the int() of a line's prefix
    from vllm_doctor.diagnosis.engine import Diagnoser
    from vllm_doctor.facts import Facts
    from vllm_doctor.rules.catalog import load_catalog
    from vllm_doctor.sources.lines import parse_line

    catalog = load_catalog(checkout / "rules")
    Diagnoser(catalog, Facts())                 # the index is built once, before the forks
    out: dict[str, list[tuple[float, str, str]]] = {}
    for rule_id, texts in examples.items():
        for text in texts:
            for kind, line in adversarial_lines(text, size):
                out.setdefault(rule_id, []).append((_forked(catalog, line, timeout, Diagnoser, Facts, parse_line),
                                                    kind, text))
        print(f"  .. {rule_id}", file=sys.stderr, flush=True)
    return out


def _forked(catalog, line: str, timeout: float, Diagnoser, Facts, parse_line) -> float:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: diagnose, write its CPU seconds, leave
        os.close(read)
        try:
            start = time.process_time()
            diagnoser = Diagnoser(catalog, Facts())
            diagnoser.feed(parse_line(line, "hostile.log", 1))
            diagnoser.lines = 1
            diagnoser.finish()
            os.write(write, f"{time.process_time() - start:.6f}".encode())
        except BaseException as exc:              # noqa: BLE001 - a crash is a figure too
            os.write(write, f"error {type(exc).__name__}".encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read)
        return float("inf")
    got = os.read(read, 100).decode()
    os.close(read)
    return float(got) if got and not got.startswith("error") else float("nan")


def report(figures: dict[str, list[tuple[float, str, str]]], timeout: float, unit: str) -> None:
    print(f"{'rule':32s} {'lines':>5s} {'worst ' + unit:>12s}  worst line")
    over = []
    for rule_id, got in figures.items():
        worst = max(got, key=lambda g: (g[0] if g[0] == g[0] else -1.0))
        shown = f"> {timeout:g}" if worst[0] == float("inf") else f"{worst[0]:.3f}"
        print(f"{rule_id:32s} {len(got):5d} {shown:>12s}  {worst[1]} of {worst[2][:60]!r}")
        if worst[0] > TARGET:
            over.append(f"{rule_id} ({shown} s)")
        errors = sum(1 for g in got if g[0] != g[0])
        if errors:
            print(f"{'':32s} {errors} line(s) raised")
    print(f"over the {TARGET:g} s target: {', '.join(over) if over else 'none'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("cli", "inprocess"), default="cli")
    ap.add_argument("--checkout", default=str(ROOT))
    ap.add_argument("--rules", default="")
    ap.add_argument("--examples", type=int, default=None)
    ap.add_argument("--size", type=int, default=SIZE)
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args(argv)
    checkout = Path(args.checkout).resolve()
    examples = rule_examples(checkout / "rules", {r for r in args.rules.split(",") if r}, args.examples)
    print(f"checkout {checkout}, mode {args.mode}, lines of {args.size:,} characters")
    if args.mode == "cli":
        report(measure_cli(examples, checkout, args.timeout, args.size), args.timeout, "wall s")
    else:
        report(measure_inprocess(examples, checkout, args.timeout, args.size), args.timeout, "CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
