"""Regenerate versions.json from the reference notes (run by hand when they change).

    python src/vllm_doctor/data/flags/build_flags.py [REFERENCE_DIR] [--out DIR]

REFERENCE_DIR (default: the checkout's docs/reference/) holds vllm-flags.txt (the real 0.34.0 parser
dump) and vllm-flags-history.md; versions.json is written to --out (default: next to this file).
Each flag gets a range "LO..HI": LO is the first release that had it ("" = before our oldest list,
">X" = first seen after release X, exact release unknown), HI is its last release or HEAD.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HEAD = "0.34.0"
# "Before 0.4.0 the OpenAI server flags (`--host`, `--port`, ...) lived in vllm/entrypoints/openai/api_server.py
# itself" (the history's own note): the tables' 0.4.0 is cli_args.py's first release, not theirs. These are the ones an
# `args: Namespace(...)` of a 0.2-0.3 server shows (logs_corpus/real/config/l803.log); they get "before our oldest list".
API_SERVER_BEFORE_0_4 = ("--host", "--port", "--allow-credentials", "--allowed-origins", "--allowed-methods",
                         "--allowed-headers", "--served-model-name", "--chat-template", "--response-role",
                         "--ssl-keyfile", "--ssl-certfile")
HERE = Path(__file__).resolve().parent


def default_reference() -> Path:
    """docs/reference/ of the checkout this file is in (found upwards, so moving the package keeps it)."""
    for parent in HERE.parents:
        if (parent / "docs" / "reference" / "vllm-flags.txt").is_file():
            return parent / "docs" / "reference"
    raise SystemExit("build_flags: no docs/reference/vllm-flags.txt above " + str(HERE) + "; pass REFERENCE_DIR")


def _vt(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v.split(".post")[0]))


def build(ref: Path) -> dict:
    head = [ln.strip() for ln in (ref / "vllm-flags.txt").read_text().splitlines()
            if ln.startswith("-")]
    hist = (ref / "vllm-flags-history.md").read_text()
    # exact first/last seen from the two tables (removed flags and frequently used flags)
    rows = re.findall(r"^\| `(-[^`]+)` \| ([0-9][^ |]*) \| ([0-9][^ |]*)", hist, re.M)
    exact = {f: (lo, hi) for f, lo, hi in rows}
    # alias line: `-tp` 0.1.7..HEAD, `-dpl/-dpa` 0.9.0..HEAD ...
    line = next(ln for ln in hist.splitlines() if ln.startswith("Short aliases"))
    for names, lo, hi in re.findall(r"`([^`]+)` (\d[\w.]*)\.\.(HEAD|\d[\w.]*)", line):
        for n in names.split("/"):
            exact.setdefault(n if n.startswith("-") else "-" + n, (lo, hi if hi != "HEAD" else HEAD))
    # full lists at sampled releases
    snaps = {}
    for ver, body in re.findall(r"^### (\d[\w.]*) \(.*?\n\n```\n(.*?)```", hist, re.M | re.S):
        snaps[ver] = set(body.split())
    order = sorted(snaps, key=_vt)
    ranges = {}
    for f in sorted(set(head) | set(exact) | set().union(*snaps.values())):
        if f in exact:
            lo, hi = exact[f]
        else:
            seen = [v for v in order if f in snaps[v]]
            if seen:
                before = [v for v in order if _vt(v) < _vt(seen[0])]
                lo = ">" + before[-1] if before else ""
                later = [v for v in order if _vt(v) > _vt(seen[-1])]
                hi = HEAD if f in head else (">" + seen[-1] if not later else seen[-1])
            else:  # only in the HEAD dump: first seen after the newest sampled list
                lo, hi = ">" + order[-1], HEAD
        if f in head:
            hi = HEAD
        if f in API_SERVER_BEFORE_0_4:
            lo = ""
        ranges[f] = f"{lo}..{'HEAD' if hi == HEAD else hi}"
    # the notes' origin, as the committed versions.json records it (docs/reference/ holds verbatim copies)
    return {"_source": "docs/reference/vllm-flags.txt (0.34.0 parser) + docs/reference/vllm-flags-history.md",
            "head": HEAD, "snapshots": order, "flags": ranges}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Regenerate versions.json from the vLLM flag reference notes.")
    parser.add_argument("reference", nargs="?", type=Path, metavar="REFERENCE_DIR", help="folder with "
                        "vllm-flags.txt and vllm-flags-history.md (default: docs/reference/ of this checkout)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write versions.json to (default: %(default)s)")
    args = parser.parse_args()
    data = build(args.reference or default_reference())
    (args.out / "versions.json").write_text(json.dumps(data, indent=0, sort_keys=False) + "\n")
    print(len(data["flags"]), "flags")
