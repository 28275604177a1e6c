#!/usr/bin/env python3
"""Harvest what NCCL can say when it fails, release by release: every `WARN(...)` format string in its C/C++
source and every `ncclGetErrorString` text, as message templates (tools/nccl_sites.py maps each).

Not run at diagnosis time. Input: a git clone of github.com/NVIDIA/nccl (its release tags are read with
`git show`, nothing is checked out) and the tags to read, by default the last of each minor release that
PyTorch's wheels pinned from torch 2.1 (NCCL 2.18) to the newest:

    python3 tools/harvest_nccl.py --git ~/src/nccl
    python3 tools/harvest_nccl.py --remap          # redo the mappings of the data file (after a rule changed)

A template keeps the literal text; a printf conversion becomes `{name}`, named after its argument; a macro
between literals (`"Call to " name " failed : %s"`) becomes `{name}`.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nccl_sites import SITES_FILE, area_of, load, mapping, write  # noqa: E402
from vllm_sites import Site  # noqa: E402

RELEASES = ("v2.18.6-1", "v2.19.4-1", "v2.20.5-1", "v2.21.5-1", "v2.22.3-1", "v2.23.4-1", "v2.24.3-1", "v2.25.1-1",
            "v2.26.6-1", "v2.27.7-1", "v2.28.9-1", "v2.29.7-1", "v2.30.7-1")
SOURCE = re.compile(r"^src/.*\.(?:cc|cpp|cu|h|hpp)$")
CALL = re.compile(r"(?<![\w.>])WARN\s*\(")
CONVERSION = re.compile(r"%(?:%|[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfgGcspn])")
TERNARY = re.compile(r'^[^"?]+\?\s*"((?:[^"\\]|\\.)*)"\s*:\s*"(?:[^"\\]|\\.)*"$')
ERROR_STRING = re.compile(r'case\s+(\w+)\s*:\s*return\s+"((?:[^"\\]|\\.)*)"')


def git_show(git: str, tag: str, path: str) -> str:
    return subprocess.run(["git", "-C", git, "show", f"{tag}:{path}"], capture_output=True, text=True,
                          errors="replace", check=True).stdout


def source_files(git: str, tag: str) -> list[str]:
    out = subprocess.run(["git", "-C", git, "ls-tree", "-r", "--name-only", tag, "src"], capture_output=True,
                         text=True, check=True).stdout
    return [p for p in out.splitlines() if SOURCE.match(p)]


def literal_end(code: str, i: int) -> int:
    """Where the string or character literal opening at `i` ends (the index after its closing quote)."""
    j, n = i + 1, len(code)
    while j < n and code[j] != code[i]:
        j += 2 if code[j] == "\\" else 1
    return j + 1


def strip_comments(code: str) -> str:
    """Comments out, strings and characters kept (a `//` inside a string is text)."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if c in "\"'":
            j = literal_end(code, i)
            out.append(code[i:j])
            i = j
        elif code.startswith("//", i):
            i = code.find("\n", i)
            i = n if i < 0 else i
        elif code.startswith("/*", i):
            i = code.find("*/", i + 2)
            i = n if i < 0 else i + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_args(code: str, start: int) -> list[str] | None:
    """The top-level arguments of the call whose `(` is at `start`, as source text; None if it never closes."""
    depth, i, args, begin, n = 0, start, [], start + 1, len(code)
    while i < n:
        c = code[i]
        if c in "\"'":
            i = literal_end(code, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(code[begin:i].strip())
                return args
        elif c == "," and depth == 1:
            args.append(code[begin:i].strip())
            begin = i + 1
        i += 1
    return None


TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|#?\s*([A-Za-z_]\w*)|(\S)')


def format_parts(first: str) -> list[tuple[str, str]] | None:
    """The format argument as ("text", literal) and ("hole", name) parts; None unless it holds a literal."""
    parts: list[tuple[str, str]] = []
    for m in TOKEN.finditer(first):
        if m.group(1) is not None:
            text = bytes(m.group(1), "utf-8").decode("unicode_escape", errors="replace")
            parts.append(("text", text))
        elif m.group(2):
            name = m.group(2)
            if name.startswith("PRI"):          # `"%" PRIu64`: the conversion's letters
                parts.append(("text", name[-1] if name[-1] in "diouxX" else "d"))
            else:
                parts.append(("hole", name))
        else:
            return None
    return parts if any(kind == "text" for kind, _ in parts) else None


def hole_name(expr: str) -> str:
    name = re.sub(r"\W+", "_", expr.strip()).strip("_")
    return name[:48] or "value"


def template_of(args: list[str]) -> str:
    """The message with every conversion and interposed macro as `{name}` (names from the arguments)."""
    parts = format_parts(args[0]) if args else None
    if parts is None:
        return "{" + hole_name(args[0] if args else "") + "}"
    values = iter(args[1:])
    out = []
    for kind, text in parts:
        if kind == "hole":
            out.append("{" + hole_name(text) + "}")
            continue
        pos = 0
        for m in CONVERSION.finditer(text):
            out.append(text[pos:m.start()].replace("{", "(").replace("}", ")"))
            if m.group(0) == "%%":
                out.append("%")
            else:
                if "*" in m.group(0):
                    next(values, None)
                value = next(values, "value")
                chosen = TERNARY.match(value)        # `create ? "creating" : "attaching to"`: the first text
                out.append(chosen.group(1) if chosen else "{" + hole_name(value) + "}")
            pos = m.end()
        out.append(text[pos:].replace("{", "(").replace("}", ")"))
    return " ".join("".join(out).split())


DEFINITION = re.compile(r"^(?:[A-Za-z_][\w:<>,*& ]*[\s*&])?([A-Za-z_][\w:~]*)\s*\(", re.M)
NOT_FUNCTIONS = {"if", "for", "while", "switch", "return", "sizeof", "NCCLCHECK", "NCCLCHECKGOTO", "CUDACHECK"}


def function_at(code: str, pos: int) -> str:
    """The function a position is in: the last definition that starts a line (NCCL's style) before it."""
    name = "?"
    for m in DEFINITION.finditer(code, 0, pos):
        if m.group(1).split("::")[-1] not in NOT_FUNCTIONS and not code.startswith("#", m.start()):
            name = m.group(1).split("::")[-1]
    return name


def harvest_release(git: str, tag: str) -> dict[tuple[str, str], set[str]]:
    """(template, kind) -> the places (`path:function`) of one release."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in source_files(git, tag):
        code = strip_comments(git_show(git, tag, path))
        for m in CALL.finditer(code):
            args = call_args(code, m.end() - 1)
            if not args or not args[0]:
                continue
            template = template_of(args)
            found.setdefault((template, "WARN"), set()).add(f"{path}:{function_at(code, m.start())}")
        if "ncclGetErrorString(ncclResult_t" in code:
            body = code[code.index("ncclGetErrorString(ncclResult_t"):]
            body = body[:body.find("\n}") + 2]
            for case, text in ERROR_STRING.findall(body):
                if case != "ncclSuccess":
                    found.setdefault((text, "ncclResult"), set()).add(f"{path}:ncclGetErrorString")
    return found


def release_name(tag: str) -> str:
    return tag.removeprefix("v").rsplit("-", 1)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git", help="a git clone of NVIDIA/nccl")
    parser.add_argument("--tags", nargs="*", default=list(RELEASES))
    parser.add_argument("--remap", action="store_true", help="redo the mappings of the data file")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from vllm_doctor.rules.catalog import load_catalog

    catalog = load_catalog(str(Path(__file__).resolve().parent.parent / "rules"))
    if args.remap:
        releases, sites = load(SITES_FILE)
    else:
        if not args.git:
            parser.error("--git DIR is needed to harvest (or --remap)")
        by: dict[tuple[str, str], Site] = {}
        releases = [release_name(t) for t in args.tags]
        for tag in args.tags:
            for (template, kind), places in harvest_release(args.git, tag).items():
                where = sorted(places)
                site = by.setdefault((template, kind), Site(template, kind, "", area_of(where[0]), [], []))
                site.where = sorted(set(site.where) | set(where))
                site.releases.append(release_name(tag))
            print(f"{tag}: {sum(release_name(tag) in s.releases for s in by.values())} sites", file=sys.stderr)
        sites = sorted(by.values(), key=lambda s: (s.area, s.template, s.kind))
    for s in sites:
        s.maps = mapping(s, catalog)
    write(releases, sites)
    print(f"{len(sites)} sites; {sum(not s.maps.startswith('other:') for s in sites)} mapped to a rule; "
          f"{sum(s.maps == 'other:not-reviewed' for s in sites)} not reviewed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
