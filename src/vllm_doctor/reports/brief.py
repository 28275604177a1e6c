"""What the short report says about a finding, as plain rows (reports/text.py wraps and colours them).

The shape is rustc's: a title with the rule id, where (`--> file:line`), the evidence line cut to the width,
one or two "because" lines with the numbers, then the fix with its cost and the command last. `-v` adds the
explanation, all the arithmetic and the facts; `-vv` the notes and where the facts came from.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_doctor.command.edits import SetEnv
from vllm_doctor.findings import Diagnosis, Finding, Rewrite

# families whose fixes read this machine's GPUs (count, memory): without them the numbers are assumed
GPU_FAMILIES = ("parallelism", "memory")
# evidence source -> (its row's label, the prefix it drops, wrapped): `check` states what vLLM would print (a
# message, cut like evidence), `health` what the server's figures showed (prose, wrapped), each a line rules read
SYNTHESIZED = {"predicted": ("= vLLM would say: ", "", False),
               "health": ("= the server shows: ", "vllm-doctor health: ", True)}
SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}
MAX_BECAUSE = 2
_FIRST_SENTENCE = re.compile(r"(.+?[.!?])(?:\s|$)", re.S)
_LAYOUT = re.compile(r"tp=\d+ pp=\d+: ")      # a layout the parallelism remedies weighed (remedies/layouts.py)


@dataclass
class Row:
    text: str
    style: str = ""
    indent: int = 0
    wrap: bool = True          # prose wraps to the width; commands and evidence never do
    label: str = ""            # printed before the text, in `label_style`
    label_style: str = "dim"
    cut: bool = False          # evidence: cut to the width with an ellipsis


def where(line, column: int | None = None) -> str:
    return f"{line.source or '<stdin>'}:{line.lineno}" + (f":{column}" if column else "")


def evidence_window(text: str, mark: str, width: int) -> tuple[str, int | None]:
    """`text` cut to `width` characters so that `mark` (what the rule matched in it) stays in view, with `…`
    where text was left out on either side, and the mark's 0-based offset in `text` (None: not in it). Text
    before the mark gets a third of the room the mark leaves; a mark wider than the room keeps its start (and the
    line's, when that is short)."""
    at = text.find(mark) if mark else -1
    if len(text) <= width:
        return text, at if at >= 0 else None
    end = at + len(mark)
    # no mark, a mark that fits with the line's own start, or one too wide anyway behind a short start
    if at < 0 or end <= width - 1 or len(mark) > width - 2 and at <= width // 4:
        return text[:width - 1] + "…", at if at >= 0 else None
    # a third of the room before the mark; a line that ends sooner fills the room from its end
    start = min(at - max(0, (width - 2 - len(mark)) // 3), len(text) - (width - 1))
    room = width - 1 - (1 if start + width - 1 < len(text) else 0)
    return "…" + text[start:start + room] + ("…" if start + room < len(text) else ""), at


def mark_of(f: Finding, line) -> str:
    return f.marks.get((line.source, line.lineno), "")


def evidence_text(line) -> str:
    """What an evidence row shows of a line: its message, or the whole line when the message is empty."""
    return line.message.strip() or line.raw.strip()


def evidence_column(f: Finding, line) -> int | None:
    """The 1-based column in the log's line where what the rule matched in it starts (None: unknown)."""
    text = evidence_text(line)
    mark = mark_of(f, line)
    at = text.find(mark) if mark else -1
    return column_of(line, text, at if at >= 0 else None)


def column_of(line, text: str, offset: int | None) -> int | None:
    """The 1-based column in the log's own line of `offset` in `text` (the line's message, stripped)."""
    if offset is None:
        return None
    before = line.raw.find(text)
    return before + offset + 1 if before >= 0 else None


def because(f: Finding) -> list[str]:
    """The lines with this case's numbers: the remedy's first arithmetic lines (not the layouts it weighed:
    those are the fix's alternatives), else the explanation's first sentence when it carries a number (the
    rule's prose with this case's values); else nothing: a rule's general prose explains no case (-v has it)."""
    lines = [ln for ln in dict.fromkeys(f.fix.arithmetic) if not _LAYOUT.match(ln)] if f.fix is not None else []
    if lines:
        return lines[:MAX_BECAUSE]
    m = _FIRST_SENTENCE.match(" ".join(f.explanation.split()))
    return [m.group(1)] if m and len(m.group(1)) <= 240 and any(c.isdigit() for c in m.group(1)) else []


def needs_gpu_facts(d: Diagnosis) -> bool:
    return d.facts.get("gpu.count") is None and any(f.family in GPU_FAMILIES for f in d.findings
                                                    if f.rule != "unrecognized")


MANY = 10        # a finding's lines like its evidence, beyond those shown, are counted from this many on


def where_first(line, story, facts=None, column: int | None = None) -> str:
    """The `-->` line: where the evidence is, and in a log of several nodes on which node (and process)
    the root cause was printed first (events/nodes.py's story); for a failure no rule names, where its first
    crash line was (`facts`: the finding's failed_first_*)."""
    at = where(line, column)
    from vllm_doctor.events.nodes import DRIVER_LABEL, where_in_cluster

    if story is not None:
        if story.peer:                   # printed here, about the peer that went away first
            return f"{at} (the peer that closed first: node {story.first})"
        node, who, first = story.first, where_in_cluster(story.first_process, story.first_rank), story.first_line
    else:                                # one machine (the process a death line named), or a lone named node
        facts = facts or {}
        node, first = facts.get("failed_first_on"), facts.get("failed_first_line")
        who = where_in_cluster(facts.get("failed_first_process"), facts.get("failed_first_rank"))
    place = ((node if node == DRIVER_LABEL else f"node {node}") + (f" ({who})" if who else "")) if node else who
    if first is None or not place:
        return at
    if story is not None and story.tied:  # the same second on another node: the log cannot tell which first
        place += f" or {', '.join(story.tied)}"
    verb = "printed" if story is not None else "failed"
    return f"{at} on {place}" if line.lineno == first else f"{at} (first {verb} on {place}, line {first})"


def title_rows(f: Finding, story=None, width: int = 100) -> list[Row]:
    """The title, the `-->` line with the column of what the rule matched, and the evidence lines cut to the
    width around it (`width`: the terminal's; the evidence rows are indented by four)."""
    level = f.severity if f.severity in ("error", "warning") else "info"
    rows = [Row(f.title, "bold", label=f"{level}[{f.rule}]: ",
                label_style=SEVERITY_STYLE[level])]
    stated = f.evidence and SYNTHESIZED.get(f.evidence[0].source)
    if stated:          # a line the doctor wrote itself (check, health): what it stands for, no log location
        label, prefix, wrap = stated
        rows.append(Row(f.evidence[0].message.strip().removeprefix(prefix), indent=2, wrap=wrap, cut=not wrap,
                        label=label))
        return rows
    if f.evidence:
        rows.append(Row(where_first(f.evidence[0], story, f.facts, evidence_column(f, f.evidence[0])), "cyan",
                        indent=2, wrap=False, label="--> ", label_style="dim"))
        for line in f.evidence[:2]:
            cut, _ = evidence_window(evidence_text(line), mark_of(f, line), max(10, width - 4))
            rows.append(Row(cut, indent=2, wrap=False, cut=True, label="| ", label_style="dim"))
        hidden = hidden_like(f)
        if hidden:
            rows.append(Row(f"… and {hidden:,} more like {'it' if len(f.evidence) == 1 else 'these'}", "dim",
                            indent=2, wrap=False, label="| ", label_style="dim"))
    return rows


def hidden_like(f: Finding) -> int:
    """Lines like the evidence not shown, when a flood makes them worth counting (MANY or more)."""
    hidden = f.more_like_it + max(0, len(f.evidence) - 2)
    return hidden if hidden >= MANY else 0


def finding_rows(f: Finding, verbose: int, width: int = 100, story=None) -> list[Row]:
    """`story`: the root cause's node story (a log of several nodes), said in its `-->` line."""
    rows = title_rows(f, story, width)
    if verbose >= 1:
        same = f.evidence[0].source if f.evidence else None
        for line in f.supporting[:3]:      # where it is (its file only when another), as much as the width holds
            at = f"line {line.lineno}" if line.source == same else where(line)
            rows.append(Row(f"{at}: {line.message.strip()}", "dim", indent=2, wrap=False, cut=True,
                            label="related: "))
        rows.append(Row(""))
        rows += explanation_rows(f)
        rows.append(Row(""))
    else:
        lines = because(f)
        if len(lines) > 1 and len("  = because: " + lines[0]) > width:   # a long first line says enough
            lines = lines[:1]
        limit = 2 * (width - len("  = because: ")) - 1       # two rows at most; -v has the whole table
        lines = [ln if len(ln) <= limit else ln[:limit - 1].rstrip(" ,;") + "…" for ln in lines]
        rows += [Row(text, indent=2, label="= because: ") for text in lines]
    for error in f.errors:
        rows.append(Row(error, indent=2, label="= error: ", label_style="bold red"))
    if verbose >= 2:
        rows += [Row(note, indent=2, label="= note: ", label_style="yellow") for note in f.notes]
    return rows


def explanation_rows(f: Finding) -> list[Row]:
    """The rule's prose as paragraphs that wrap to the width (the TOML text is broken at ~115 columns),
    then the arithmetic one line each."""
    arithmetic = set(f.fix.arithmetic) if f.fix is not None else set()
    rows: list[Row] = []
    for para in f.explanation.split("\n\n"):
        lines = para.split("\n")
        if rows:
            rows.append(Row(""))
        if arithmetic and all(ln in arithmetic for ln in lines):
            rows += [Row(ln, indent=2, label="= ") for ln in lines]
        else:
            rows.append(Row(" ".join(ln.strip() for ln in lines), indent=2))
    return rows


def other_row(f: Finding) -> Row:
    at = f" ({where(f.evidence[0])})" if f.evidence else ""
    return Row(f"{f.title}{at}", label=f"also[{f.rule}]: ", label_style="bold yellow")


def alternative_rows(f: Finding, verbose: int) -> list[Row]:
    """Each alternative with its cost and its own complete command (-v; the short report counts them)."""
    rows = []
    if verbose < 1:
        return rows
    for i, (summary, _command) in enumerate(f.alternatives):
        rows.append(Row(summary, indent=2, label="or: "))
        rewrite = f.alt_rewrites[i] if i < len(f.alt_rewrites) else None
        rows += command_rows(rewrite, indent=6, show_was=False) if rewrite else []
    return rows


def command_rows(rw: Rewrite, indent: int = 2, show_was: bool = True) -> list[Row]:
    """The fix as the user applies it, never wrapped: `run:` only for a command they can paste."""
    rows: list[Row] = []
    if rw.form in ("command", "rebuilt"):
        if show_was and rw.was and rw.was.split() != (rw.command or "").split():
            rows.append(Row(rw.was, "red", indent, wrap=False, label="was: "))
        rows.append(Row(rw.command or "", "bold green", indent, wrap=False, label="run: "))
        if rw.form == "rebuilt":
            rows.append(Row("rebuilt from the arguments vLLM logged; in your own launcher change: "
                            + "; ".join(rw.changes), "dim", indent))
    elif rw.form == "edit":
        rows.append(Row(rw.instruction, "bold green", indent, wrap=False, label="edit: "))
    elif rw.form == "flags":
        rows.append(Row("; ".join(rw.changes), "bold green", indent, wrap=False, label="change: "))
        rows.append(Row(rw.instruction, "dim", indent))
    else:
        rows.append(Row("rerun your command, unchanged", indent=indent, label="then: "))
    return rows


def fix_rows(d: Diagnosis, verbose: int) -> list[Row]:
    """The root cause's fix (and the others' it merged), its alternatives, then the one command."""
    root = d.findings[0]
    rows: list[Row] = []
    if root.fix is None:
        return rows
    node = root.facts.get("failed_first_on")
    from vllm_doctor.events.nodes import DRIVER_LABEL

    on_node = node and node != DRIVER_LABEL and any(isinstance(e, SetEnv) for e in root.fix.edits)
    # a variable to set where the failure started: say on which node (the rest of the cluster may be fine)
    rows.append(Row(root.fix.summary, label=f"help (on {node}): " if on_node else "help: ", label_style="bold green"))
    combined = d.combined
    # the other findings the combined fix covers, and those whose fix is an action outside the command
    others = [f for f in d.findings[1:] if combined and f.fix is not None and (f.rule in combined.rules or f.unchanged)]
    rows += [Row(f.fix.summary, label=f"help[{f.rule}]: ", label_style="bold green") for f in others]
    rows += alternative_rows(root, verbose)
    rewrite = combined or root.rewrite
    if rewrite is not None:
        rows += command_rows(rewrite)
        # an action outside the command first (free the GPU): the change its summary offers otherwise has
        # its own command, so no flag change is left to "rerun unchanged" (-v lists every alternative)
        other = next((rw for rw in root.alt_rewrites if rw.form != "outside"), None)
        if rewrite.form == "outside" and other is not None and verbose < 1:
            rows[-1] = Row("rerun your command, unchanged, once that is done", indent=2, label="then: ")
            rows += [Row(r.text, r.style, 2, r.wrap, "otherwise " + r.label, r.label_style)
                     for r in command_rows(other, show_was=False) if r.label]
        if len(rewrite.rules) > 1:
            rows.append(Row("this fixes " + ", ".join(rewrite.rules), "dim", indent=2))
        rows += [Row(c, "yellow", indent=2, label="conflict: ", label_style="bold yellow") for c in rewrite.conflicts]
    return rows


def see_row(d: Diagnosis, verbose: int) -> Row | None:
    root = d.findings[0]
    if root.rule == "unrecognized":
        return None
    n = len(root.alternatives)
    others = f"{n} other fix{'es' if n > 1 else ''}, " if n else ""
    more = "" if verbose else f" · -v: {others}details"
    return Row(f"vllm-doctor explain {root.rule}{more}", "dim", 2, label="see: ")
