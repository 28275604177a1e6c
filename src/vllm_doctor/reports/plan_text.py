"""`vllm-doctor plan` as a table for a person.

Only what is known is printed: a memory column whose values are all unknown (no --gpu-memory, no GPU facts)
is left out, and the layouts that do not fit are hidden unless asked for (`show_all`), with one line saying
how many. "best" names a layout that fits; with the memory unknown the top layout is only a first choice,
and when nothing fits the report says why (the closest layout's arithmetic) and what would fit.
"""
from __future__ import annotations

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


def shown_layouts(result: PlanResult, show_all: bool) -> tuple[list[Layout], int]:
    """(the rows to print, how many that do not fit are hidden)."""
    if show_all:
        return list(result.layouts), 0
    rows = [lay for lay in result.layouts if lay.fits is not False]
    return rows, len(result.layouts) - len(rows)


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


def _table(rows: list[Layout]):
    from rich.table import Table

    table = Table(box=None, show_edge=False, pad_edge=False)
    columns = shown_columns(rows)
    table.add_column("#", justify="right")
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("fits", "notes") else "right")
    for i, lay in enumerate(rows, 1):
        table.add_row(str(i), *(cell(lay) or "" for _, cell in columns))
    return table


def _verdict(result: PlanResult, hidden: int) -> list[str]:
    """The lines after the table: hidden rows, notes, then best / first choice / why nothing fits."""
    lines = []
    if hidden:
        lines.append("1 layout that does not fit hidden; --all shows it" if hidden == 1 else
                     f"{hidden} layouts that do not fit hidden; --all shows them")
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


def render_text(result: PlanResult, color: bool, show_all: bool = False) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=color, no_color=not color, width=140, highlight=False)
    rows, hidden = shown_layouts(result, show_all)
    for line in _header(result):
        console.print(line, soft_wrap=True)    # a line cut at the width would split numbers from units
    if rows:
        console.print(_table(rows))
    for line in _verdict(result, hidden):
        console.print(line, soft_wrap=True)
    return out.getvalue()
