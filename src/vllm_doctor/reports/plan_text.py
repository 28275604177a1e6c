"""`vllm-doctor plan` as a table for a person.

Only what is known is printed: a memory column whose values are all unknown (no --gpu-memory, no GPU facts)
is left out, and the layouts that do not fit are hidden unless asked for (`show_all`), with one line saying
how many. "best" names a layout that fits; with the memory unknown the top layout is only a first choice,
and when nothing fits the report says why (the closest layout's arithmetic) and what would fit.
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import Any

from vllm_doctor.checks.plan import Layout, PlanResult


def _gib(x: float | None) -> str | None:
    return None if x is None else f"{x:.1f} GiB"


# (header, cell) for each column; a cell of None is unknown
COLUMNS: list[tuple[str, Callable[[Layout], Any]]] = [
    ("TP", lambda x: str(x.tp)),
    ("PP", lambda x: str(x.pp)),
    ("GPUs", lambda x: str(x.world)),
    ("weights/GPU", lambda x: _gib(x.weights_per_gpu)),
    ("KV/GPU", lambda x: _gib(x.kv_gib)),
    ("KV tokens", lambda x: None if x.kv_tokens is None else f"{x.kv_tokens:,}"),
    ("concurrency", lambda x: None if x.concurrency is None else f"{x.concurrency:.1f}x"),
    ("fits", lambda x: None if x.fits is None else "yes" if x.fits else "no"),
    ("notes", lambda x: "; ".join(x.notes)),
]


def shown_layouts(result: PlanResult, show_all: bool) -> tuple[list[Layout], int, int]:
    """(the rows to print, how many that do not fit are hidden, how many pipeline layouts are hidden because the
    model fits on one GPU: an operator runs replicas of it, never pipeline stages)."""
    if show_all:
        return list(result.layouts), 0, 0
    rows = [lay for lay in result.layouts if lay.fits is not False]
    unfit = len(result.layouts) - len(rows)
    if any(lay.world == 1 and lay.fits for lay in rows):
        staged = [lay for lay in rows if lay.pp > 1]
        return [lay for lay in rows if lay.pp == 1], unfit, len(staged)
    return rows, unfit, 0


def shown_columns(rows: list[Layout]) -> list[tuple[str, Callable[[Layout], Any]]]:
    """The columns with at least one known value; "fits" only when the rows differ (all "yes" says nothing)."""
    out = []
    for header, cell in COLUMNS:
        values = {cell(lay) for lay in rows}
        if values <= {None} or (header == "fits" and values == {"yes"}):
            continue
        out.append((header, cell))
    return out


def _header(result: PlanResult) -> list[str]:
    mem = f" x {result.gpu_gib:.1f} GiB" if result.gpu_gib else ""
    mml = f", max_model_len {result.max_model_len} ({result.max_model_len_source})" if result.max_model_len else ""
    lines = [(f"Layouts for {result.model} on {result.gpus} GPU(s){mem}, "
              f"--gpu-memory-utilization {result.utilization:g}{mml}"),
             f"valid --tensor-parallel-size (vLLM's rules): {', '.join(map(str, result.valid_tp))}"]
    if result.weights_gib:
        best = result.best
        extra = (f"; per GPU at tp={best.tp} pp={best.pp}: {best.memory.arithmetic()}" if best and best.memory
                 else "")
        lines.append(f"weights: {result.weights_gib:.1f} GiB ({result.weights_source}){extra}")
        if best and best.memory and best.memory.assumptions:
            lines.append("assumed: " + "; ".join(best.memory.assumptions))
    if result.domains:
        lines.append(f"topology: {result.domains}")
    return lines


def _table(rows: list[Layout], notes: bool = True):
    """The layouts, one row each; `notes`: with the notes column (else they follow the table)."""
    from rich.table import Table

    table = Table(box=None, show_edge=False, pad_edge=False)
    columns = [c for c in shown_columns(rows) if notes or c[0] != "notes"]
    table.add_column("#", justify="right")
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("fits", "notes") else "right")
    for i, lay in enumerate(rows, 1):
        table.add_row(str(i), *(cell(lay) or "" for _, cell in columns))
    return table


def _width_before_notes(rows: list[Layout]) -> int:
    """The table's width up to its notes column: each column as wide as its widest cell, two spaces apart."""
    columns = [("#", lambda lay, i: str(i))] + [(h, lambda lay, i, c=c: c(lay) or "")
                                                 for h, c in shown_columns(rows) if h != "notes"]
    widths = [max([len(h)] + [len(cell(lay, i)) for i, lay in enumerate(rows, 1)]) for h, cell in columns]
    return sum(widths) + 2 * len(widths)


def _verdict(result: PlanResult, hidden: int, staged: int = 0) -> list[str]:
    """The lines after the table: hidden rows, notes, then best / first choice / why nothing fits."""
    lines = []
    if hidden:
        lines.append("1 layout that does not fit hidden; --all shows it" if hidden == 1 else
                     f"{hidden} layouts that do not fit hidden; --all shows them")
    if staged:
        lines.append(f"{staged} pipeline-parallel layout{'s' if staged > 1 else ''} hidden: the model fits on one GPU, "
                     "so replicas serve more than pipeline stages; --all shows them")
    lines += [f"note: {n}" for n in result.notes if not n.startswith("no layout fits")]
    best = result.best
    if best is None:
        return lines
    if result.nothing_fits:
        lines.append(f"nothing fits on {result.gpus} GPU(s): {result.shortfall}")
        lines.append("would fit: " + ("; or ".join(result.would_fit) if result.would_fit else
                                      "no change tried here (more GPUs, shorter context, FP8 KV cache, "
                                      "a quantized checkpoint) is enough"))
        return lines
    lines.append("best:" if best.fits else "first choice (memory fit not checked):")
    lines.append(f"  {best.command}")
    return lines


_UNIT = re.compile(r"(\d) (GiB|MiB|GB|tokens|bytes)\b")
_GLUE = "\x00"


def _wrapped(line: str, width: int) -> list[str]:
    """`line` wrapped to `width` at spaces, never between a number and its unit, continuations indented."""
    glued = _UNIT.sub(lambda m: f"{m.group(1)}{_GLUE}{m.group(2)}", line)
    out = textwrap.wrap(glued, width=width, subsequent_indent="  ", break_on_hyphens=False,
                        break_long_words=False) or [""]
    return [part.replace(_GLUE, " ") for part in out]


def render_text(result: PlanResult, color: bool, show_all: bool = False, width: int = 100) -> str:
    """The plan at `width` columns (the terminal's): prose wrapped, the table fitted, the command never cut."""
    import io

    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=color, no_color=not color, width=width, highlight=False)
    rows, hidden, staged = shown_layouts(result, show_all)
    for line in _header(result):
        for part in _wrapped(line, width):
            console.print(part, soft_wrap=True)
    if rows:
        # the notes as a column while it fits; else under the table, by row number (a squeezed column breaks
        # them into fragments)
        inline = max((len("; ".join(lay.notes)) for lay in rows), default=0) + _width_before_notes(rows) <= width
        console.print(_table(rows, notes=inline))
        for i, lay in enumerate(rows, 1):
            if lay.notes and not inline:
                for part in _wrapped(f"{i:>2}: " + "; ".join(lay.notes), width):
                    console.print(part.replace("  ", "    ", 1) if part.startswith("  ") else part, soft_wrap=True)
    verdict = _verdict(result, hidden, staged)
    for line in verdict:
        # the best layout's command is one line to copy (it may be wider than the terminal, never cut)
        for part in [line] if line.startswith("  vllm ") else _wrapped(line, width):
            console.print(part, soft_wrap=True)
    return out.getvalue()
