"""Diagnosing a big log vs grep and ripgrep running the catalog's regexes, interleaved in one run.

At each --sizes, on the log gen_log.py generates (cached in the temp dir), --rounds rounds of:
  vllm-doctor      python -m vllm_doctor --no-live --format json LOG
  grep -c          LC_ALL=C grep -E -c -f patterns.txt LOG
  grep (pipe)      LC_ALL=C grep -E -f patterns.txt LOG, its stdout a pipe this script reads and drops
                   (GNU grep stops at the first match when its output is /dev/null: not measured so)
  rg -c            rg --no-unicode -c -f rg-patterns.txt LOG   (when ripgrep is installed)
in rotating order; medians of wall s, CPU s (user+sys), MB/s and peak RSS, and the doctor's speed-up
(other tool's wall / doctor's wall). Targets: >= 2x grep -c at 200 MiB and 1 GiB, >= 1x rg at 1 GiB.

patterns.txt: every rule regex as POSIX ERE (named/non-capturing groups -> groups, \\d \\s \\w ->
classes, lazy -> greedy, anchors dropped since rules search the prefix-stripped message).
rg-patterns.txt: the same regexes in Rust syntax (named groups -> groups, since rg refuses duplicate
names; needless escapes such as \\' dropped). Look-arounds, back-references, atomic groups and
possessive quantifiers exist in neither: such patterns are left out and counted, as is any pattern the
tool itself refuses (checked once per pattern).

    python bench/scan_bench.py [--sizes 10M,200M,1G] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log
from compare import Command, interleave, ratio, stderr_progress, warm

C_ENV = {**os.environ, "LC_ALL": "C"}
RUST_META = set("\\.+*?()|[]{}^$#&-~")
ESCAPE, CLASS, BACKREF = "\x00", "\x01", "\x02"      # cannot occur in a rule regex


def skeleton(pattern: str) -> str:
    """`pattern` with each character class as CLASS, each escape as ESCAPE (a back-reference `\\1`,
    `\\g<n>` as BACKREF): what is left are the operators, so a search cannot be fooled by `[*+]` or `\\(`."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(BACKREF if pattern[i + 1] in "123456789g" else ESCAPE)
            i += 2
        elif c == "[":
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":          # a leading ] is a literal
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            out.append(CLASS)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


LEFT_OUT = {
    "look-around": r"\(\?<?[=!]",
    "back-reference": BACKREF + r"|\(\?P=",
    "atomic group": r"\(\?>",
    "possessive quantifier": r"[*+?}]\+",
}


def left_out(pattern: str) -> str | None:
    """Why neither ERE nor Rust regex can express `pattern` (None: no such construct)."""
    skel = skeleton(pattern)
    for why, construct in LEFT_OUT.items():
        if re.search(construct, skel):
            return why
    return None


def _strip_anchors(p: str) -> str:
    p = p.lstrip("^")
    if p.endswith("$") and not p.endswith("\\$"):
        p = p[:-1]
    return p


def to_ere(pattern: str) -> str | None:
    """A Python/`regex` pattern as POSIX ERE (GNU grep), or None when it cannot be expressed."""
    if left_out(pattern) or re.search(r"\(\?[aiLmsux-]+\)|\\[AZzG]|\\p\{", pattern):
        return None
    p = re.sub(r"\(\?P?<\w+>", "(", pattern)
    p = p.replace("(?:", "(")
    p = re.sub(r"(?<!\\)([*+?}])\?", r"\1", p)          # lazy → greedy
    out, i, in_class = [], 0, False
    classes = {"d": "0-9", "s": "[:space:]", "w": "[:alnum:]_"}
    negated = {"D": "[^0-9]", "S": "[^[:space:]]", "W": "[^[:alnum:]_]"}
    while i < len(p):
        c = p[i]
        if c == "\\" and i + 1 < len(p):
            n = p[i + 1]
            if n in classes:
                out.append(classes[n] if in_class else f"[{classes[n]}]")
            elif n in negated:
                if in_class:
                    return None
                out.append(negated[n])
            elif n == "b":
                out.append("\\b")
            elif n in "nrt":
                out.append({"n": "\n", "r": "\r", "t": "\t"}[n] if not in_class else "")
            elif n.isalnum():
                return None
            else:
                out.append("\\" + n if not in_class else n)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and out and out[-1] != "[":
            in_class = False
        out.append(c)
        i += 1
    return _strip_anchors("".join(out)) or None


def to_rust(pattern: str) -> str | None:
    """A Python/`regex` pattern in Rust regex syntax (ripgrep), or None when it cannot be expressed."""
    if left_out(pattern):
        return None
    p = re.sub(r"\(\?P?<\w+>", "(", pattern)           # rg refuses a group name used twice
    out, i, in_class = [], 0, False
    while i < len(p):
        c = p[i]
        if c == "\\" and i + 1 < len(p):
            n = p[i + 1]
            # Rust refuses an escaped character that has no meaning (\' \" \/ ...): write it plain
            out.append(n if not n.isalnum() and n not in RUST_META else "\\z" if n == "Z" else "\\" + n)
            i += 2
            continue
        if c == "[" and in_class:
            out.append("\\[")                            # a nested class in Rust, a literal in Python
        elif c == "[":
            in_class, j = True, i + 1
            j += p[j:j + 1] == "^"
            out.append(p[i:j])
            if p[j:j + 1] == "]":                        # a leading ] is a literal
                out.append("\\]")
                j += 1
            i = j
            continue
        else:
            in_class = in_class and c != "]"
            out.append(c)
        i += 1
    return _strip_anchors("".join(out)) or None


def _refused(argv: list[str]) -> bool:
    return subprocess.run(argv, input=b"", capture_output=True, env=C_ENV, check=False).returncode == 2


def write_patterns(directory: str, tool: str = "grep") -> tuple[str, int, int]:
    """patterns.txt (grep) or rg-patterns.txt (rg) in `directory`: (path, converted, left out)."""
    from vllm_doctor.rules.catalog import cached_catalog

    convert = to_ere if tool == "grep" else to_rust
    converted, skipped = [], 0
    for pattern in cached_catalog().patterns:
        text = convert(pattern.regex.pattern)
        check = (["grep", "-E", "-e", text] if tool == "grep"
                 else ["rg", "--no-unicode", "-e", text, os.devnull]) if text else None
        if check is None or _refused(check):
            skipped += 1
            continue
        converted.append(text)
    path = os.path.join(directory, "patterns.txt" if tool == "grep" else "rg-patterns.txt")
    with open(path, "w") as f:
        f.write("\n".join(converted) + "\n")
    return path, len(converted), skipped


def count_findings(report: bytes) -> str:
    """How many findings a JSON report (schema_version 1 or 2) holds; schema 2's `warnings` also name
    rules, so counting `"rule":` would overcount."""
    from vllm_doctor.reports.json_report import ReportError, read_report

    try:
        return str(len(read_report(report)["findings"]))
    except ReportError as exc:
        return f"? ({exc})"


def one_line_log(directory: str) -> str:
    """A one-line healthy log: the doctor's start-up and catalog load alone (it refuses an empty file)."""
    path = os.path.join(directory, "one-line.log")
    with open(path, "w") as f:
        f.write("(APIServer pid=4242) INFO 12-01 00:31:30 [api_server.py:1000] Starting vLLM API server\n")
    return path


def commands(log: str, patterns: str, rg_patterns: str | None) -> list[Command]:
    small = one_line_log(os.path.dirname(patterns))
    cmds = [
        Command("vllm-doctor --format json", [sys.executable, "-m", "vllm_doctor", "--no-live", "--format", "json", log],
                C_ENV),
        Command("grep -E -c -f patterns.txt", ["grep", "-E", "-c", "-f", patterns, log], C_ENV),
        Command("grep -E -f patterns.txt | (read)", ["grep", "-E", "-f", patterns, log], C_ENV, stdout="discard"),
        Command("  doctor start-up (1-line log)",
                [sys.executable, "-m", "vllm_doctor", "--no-live", "--format", "json", small], C_ENV),
    ]
    if rg_patterns:
        cmds.insert(3, Command("rg --no-unicode -c -f rg-patterns", ["rg", "--no-unicode", "-c", "-f", rg_patterns, log],
                               C_ENV))
    return cmds


def result(name: str, s) -> str:
    if name.startswith("vllm-doctor"):
        return f"exit {s.rc}, {count_findings(s.out)} finding(s)"
    if "(read)" in name:
        return f"{s.out_lines:,} matching lines read"
    if "start-up" in name:
        return f"exit {s.rc}"
    return f"{s.out.decode(errors='replace').strip() or '?'} matching lines"


def report(spec: str, log: str, got: dict, gen_s: float) -> None:
    size = os.path.getsize(log)
    print(f"\n== {spec}: {size / 2**20:,.0f} MiB, {gen_log.count_lines(log):,} lines "
          f"({'cached' if gen_s < 1 else f'generated in {gen_s:.1f} s'})")
    print(f"{'tool':34s} {'wall s':>8s} {'CPU s':>7s} {'MB/s':>8s} {'peak RSS MiB':>13s}  result")
    for name, s in got.items():
        mb = "" if "start-up" in name else f"{s.mb_s(size):8.1f}"
        print(f"{name:34s} {s.wall:8.2f} {s.cpu:7.2f} {mb:>8s} {s.rss_mib:13.1f}  {result(name, s.last)}")
    doctor = got["vllm-doctor --format json"].wall
    targets = {"grep -E -c -f patterns.txt": "target >= 2x at 200 MiB and 1 GiB",
               "rg --no-unicode -c -f rg-patterns": "target >= 1x at 1 GiB"}
    for name, s in got.items():
        if name.startswith(("grep", "rg")):
            note = f" ({targets[name]})" if name in targets else ""
            print(f"doctor speed-up vs {name}: {ratio(s.wall, doctor)}{note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10M,200M,1G", help="comma-separated log sizes (10M, 200M, 1G ...)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="vllm-doctor-scan-")
    patterns, n_conv, n_skip = write_patterns(workdir, "grep")
    print(f"patterns.txt: {n_conv} catalog regexes as ERE, {n_skip} left out")
    rg_patterns = None
    if shutil.which("rg"):
        rg_patterns, r_conv, r_skip = write_patterns(workdir, "rg")
        print(f"rg-patterns.txt: {r_conv} catalog regexes in Rust syntax, {r_skip} left out")
    else:
        print("rg: not installed")
    print(f"{args.rounds} interleaved rounds per size; figures are medians")
    for spec in [s for s in args.sizes.split(",") if s]:
        t0 = time.perf_counter()
        log = gen_log.cached(gen_log.parse_size(spec))
        gen_s = time.perf_counter() - t0
        warm(log)
        got = interleave(commands(log, patterns, rg_patterns), args.rounds, stderr_progress)
        report(spec, log, got, gen_s)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
