"""Remedies for what `vllm-doctor health` finds on a running server (rules/server-*.toml): the numbers it
read are the captures of the line checks/health.py states them in."""
from __future__ import annotations

from vllm_doctor.command.edits import SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext


def fix_kv_saturated(ctx: RemedyContext) -> Fix:
    """Fewer requests at once: a quarter below those running when it preempted (they did not fit), or more
    room for the cache. The launch's own --max-num-seqs, when known, is said beside it (it is at least the
    number running, so three quarters of those is always below it)."""
    running = ctx.capture_int("running") or 0
    limit = ctx.arg_int("max_num_seqs")
    seqs = max(1, running * 3 // 4)
    arithmetic = [f"--max-num-seqs {seqs} = 3/4 x {running} running, which preempted {ctx.capture('preemptions')} "
                  f"times in {ctx.capture('seconds')} s" + (f" (now {limit})" if limit else "")]
    return Fix(f"Admit fewer requests at once: --max-num-seqs {seqs} ({running} at once did not fit the KV cache)",
               [SetFlag("--max-num-seqs", str(seqs))], arithmetic=arithmetic,
               alternatives=[Alternative("give the KV cache more room: a higher --gpu-memory-utilization, a shorter "
                                         "--max-model-len, --kv-cache-dtype fp8 or more GPUs", [],
                                         "less memory for anything else on the GPU, or shorter contexts")],
               notes=["Preempted requests are recomputed when room comes back: the server answers, but slower."])


def fix_no_progress(ctx: RemedyContext) -> Fix:
    seconds, running = ctx.capture("seconds"), ctx.capture_int("running") or 0
    waiting = ctx.capture_int("waiting") or 0
    return Fix(f"Find what the engine waits on, then restart the server: run vllm-doctor on the server's log (a "
               f"watchdog timeout or a shared-memory wait there names the cause); {running + waiting} request(s) "
               f"made no progress in {seconds} s", [],
               arithmetic=[f"no token generated and no request finished in {seconds} s; {running} running, "
                           f"{waiting} waiting; /health answered 200"],
               notes=["`py-spy dump --pid <engine core pid>` shows where a hung engine waits."])
