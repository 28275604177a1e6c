"""`vllm-doctor plan` as a table for a person."""
from __future__ import annotations

from vllm_doctor.checks.plan import PlanResult
from vllm_doctor.vllm_math.sizing import ACTIVATION_GIB


def render_text(result: PlanResult, color: bool) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, force_terminal=color, no_color=not color, width=140, highlight=False)
    mem = f" x {result.gpu_gib:.1f} GiB" if result.gpu_gib else ""
    console.print(f"Layouts for {result.model} on {result.gpus} GPU(s){mem}, "
                  f"--gpu-memory-utilization {result.utilization:g}, max_model_len "
                  f"{result.max_model_len or '?'} ({result.max_model_len_source})")
    console.print(f"valid --tensor-parallel-size (vLLM's rules): {', '.join(map(str, result.valid_tp))}")
    if result.weights_gib:
        console.print(f"weights: {result.weights_gib:.1f} GiB ({result.weights_source}); "
                      f"activation allowance {ACTIVATION_GIB:g} GiB per GPU")
    if result.domains:
        console.print(f"topology: {result.domains}")
    table = Table(box=None if not color else None, show_edge=False, pad_edge=False)
    for col in ("#", "TP", "PP", "GPUs", "weights/GPU", "KV/GPU", "KV tokens", "concurrency", "fits", "notes"):
        table.add_column(col, justify="right" if col not in ("fits", "notes") else "left")
    g = lambda x: "?" if x is None else f"{x:.1f} GiB"  # noqa: E731
    for i, lay in enumerate(result.layouts, 1):
        fits = {True: "yes", False: "no", None: "?"}[lay.fits]
        table.add_row(str(i), str(lay.tp), str(lay.pp), str(lay.world), g(lay.weights_per_gpu), g(lay.kv_gib),
                      "?" if lay.kv_tokens is None else f"{lay.kv_tokens:,}",
                      "?" if lay.concurrency is None else f"{lay.concurrency:.1f}x", fits, "; ".join(lay.notes))
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    if result.best:
        console.print("best:")
        console.print(f"  {result.best.command}", soft_wrap=True)
    return out.getvalue()
