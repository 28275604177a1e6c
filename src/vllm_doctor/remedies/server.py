"""Remedies for what `vllm-doctor health` finds on a running server (rules/server-*.toml): the numbers it
read are the captures of the line checks/health.py states them in."""
from __future__ import annotations

from vllm_doctor.command.edits import SetEnv, SetFlag
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
    waiting, why = ctx.capture_int("waiting") or 0, ctx.capture("why")
    seen = (f"a probe request of {ctx.capture('tokens')} tokens did not complete ({why})" if why else
            f"no token generated and no request finished in {seconds} s")
    stuck = f"the probe did not complete ({why})" if why else \
        f"{running + waiting} request(s) made no progress in {seconds} s"
    return Fix(f"Find what the engine waits on, then restart the server: run vllm-doctor on the server's log (a "
               f"watchdog timeout or a shared-memory wait there names the cause); {stuck}", [],
               arithmetic=[f"{seen}; {running} running, {waiting} waiting; /health answered 200"],
               notes=["`py-spy dump --pid <engine core pid>` shows where a hung engine waits."])


def _admit(ctx: RemedyContext) -> tuple[int | None, str]:
    """How many requests the KV cache holds, and the arithmetic: its tokens over an average finished request's,
    else the running count scaled from the cache's use to 90 %; None when it would admit no more than run now."""
    running = ctx.capture_int("running") or 0
    size, tokens = ctx.capture_int("kv_tokens"), ctx.capture_int("request_tokens")
    if size and tokens:
        seqs, why = size // tokens, f"{size} KV tokens / {tokens} tokens per finished request"
    else:
        usage = (ctx.capture_float("usage_pct") or 0.0) / 100
        if usage <= 0:
            return None, ""
        seqs, why = int(running * 0.9 / usage), f"{running} running at {usage * 100:.1f}% of the cache, scaled to 90%"
    return (seqs, why) if seqs > running else (None, why)


def fix_scheduler_bound(ctx: RemedyContext) -> Fix:
    """As many requests at once as the cache holds; the launch's own --max-num-seqs said beside it. When that
    limit is already above the running count, the token budget per step is what binds (long prompts)."""
    running, waiting = ctx.capture_int("running") or 0, ctx.capture_int("waiting") or 0
    limit = ctx.arg_int("max_num_seqs")
    seqs, why = _admit(ctx)
    budget = Alternative("raise the tokens of one step: --max-num-batched-tokens (long prompts wait on it)", [],
                         "a longer step: every running request's next token comes later")
    if limit and limit > running:
        return Fix(f"The token budget holds the queue, not --max-num-seqs {limit} ({running} running): raise "
                   "--max-num-batched-tokens", [], arithmetic=[f"{running} running < --max-num-seqs {limit}; "
                                                               f"{waiting} waiting"])
    if seqs is None:
        return Fix(f"Admit more requests at once: a higher --max-num-seqs ({running} running, {waiting} waiting)",
                   [], alternatives=[budget])
    return Fix(f"Admit as many requests as the KV cache holds: --max-num-seqs {seqs} ({running} run at once while "
               f"{waiting} wait)", [SetFlag("--max-num-seqs", str(seqs))],
               arithmetic=[f"--max-num-seqs {seqs} = {why}" + (f" (now {limit})" if limit else "")],
               alternatives=[budget],
               notes=["More requests at once share each step: each one's tokens come a little slower while the "
                      "queue empties."])


def fix_queueing(ctx: RemedyContext) -> Fix:
    """Alone (no bound found in the two readings): with the cache idle, admit more; else more replicas."""
    usage = ctx.capture_float("usage_pct")
    arithmetic = [f"{ctx.capture('queue_s')} s queued of {ctx.capture('ttft_s')} s to the first token "
                  f"({ctx.capture('share_pct')}%) over {ctx.capture('requests')} requests"]
    preempted = ctx.capture_int("preemptions")
    if preempted:
        return Fix(f"Give the KV cache more room, or admit fewer requests at once: it ran out between the readings "
                   f"({preempted} preemptions)", [], arithmetic=arithmetic,
                   alternatives=[Alternative("admit fewer at once: a lower --max-num-seqs", [],
                                             "a longer queue, but no request recomputed")],
                   notes=["Room for the cache: a higher --gpu-memory-utilization, --kv-cache-dtype fp8, a shorter "
                          "--max-model-len or more GPUs."])
    if usage is not None and usage < 50:
        return Fix(f"Admit more requests at once (the KV cache was at most {usage:g}% used): raise --max-num-seqs",
                   [], arithmetic=arithmetic,
                   notes=["Read the server again under the same load: a queue seen in both readings gives the "
                          "--max-num-seqs the cache holds."])
    return Fix("Serve more at once: add a replica (--data-parallel-size on free GPUs, or another server behind "
               "the load balancer), or give the KV cache more room", [], arithmetic=arithmetic)


def fix_gpu_idle(ctx: RemedyContext) -> Fix:
    """The ranks elsewhere: one numbering for CUDA and nvidia-smi. Else a rank that never came up: its log."""
    idle, gpus, elsewhere = ctx.capture("idle"), ctx.capture("gpus"), ctx.capture("elsewhere")
    arithmetic = [f"GPU {idle}: {ctx.capture('idle_gib')} GiB; the other {ctx.capture('busy')} of {gpus}: at least "
                  f"{ctx.capture('busy_gib')} GiB each" if ctx.capture("busy") else
                  f"GPU {idle}: {ctx.capture('idle_gib')} GiB at most; one rank's weights (the model's config over the "
                  f"launch's layout): {ctx.capture('weights_gib')} GiB"]
    if elsewhere:
        return Fix(f"Restart with one GPU numbering: CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES={gpus} "
                   f"(GPU {elsewhere} holds what GPU {idle} should)",
                   [SetEnv("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), SetEnv("CUDA_VISIBLE_DEVICES", gpus or "")],
                   arithmetic=arithmetic + [f"GPU {elsewhere}, outside the group, holds {ctx.capture('elsewhere_gib')} "
                                            "GiB"],
                   notes=[f"If another process holds that memory on GPU {elsewhere} (`nvidia-smi` lists each GPU's "
                          f"processes), no rank runs on GPU {idle}: the server's log says which rank failed."])
    return Fix(f"A rank of the server never came up on GPU {idle}: run vllm-doctor on the server's log for the "
               "rank that failed, then restart the server", [], arithmetic=arithmetic)


def fix_memory_unexplained(ctx: RemedyContext) -> Fix:
    """Stop the leftover that shares the GPU; the arithmetic says how much the server does not count, and what
    of its own the memory model sees (weights and KV cache)."""
    over, others = ctx.capture("over"), ctx.capture("others")
    used, budget, excess = ctx.capture("used_gib"), ctx.capture("budget_gib"), ctx.capture("excess_gib")
    if ctx.capture("util"):
        held = f"{ctx.capture('util')} x {ctx.capture('total_gib')} GiB"
    else:
        held = f"weights {ctx.capture('sized_weights_gib')} + KV cache {ctx.capture('sized_kv_gib')} GiB"
    arithmetic = [f"GPU {over}: {used} GiB held - {budget} GiB budget ({held}) = {excess} GiB the server does not "
                  "count"]
    if ctx.capture("weights_gib"):
        arithmetic.append(f"of the budget, the model's weights take {ctx.capture('weights_gib')} GiB per GPU and its "
                          f"KV cache {ctx.capture('kv_gib')} GiB (its size in /metrics); the rest is the activation "
                          "peak, CUDA graphs and communication buffers")
    who = f" ({others})" if others else ""
    return Fix(f"Stop what else holds memory on GPU {over}{who} if it is a leftover of an earlier run: `nvidia-smi` "
               "lists each GPU's processes", [], arithmetic=arithmetic,
               notes=["If it is meant to share the GPU, give each its part: this server's --gpu-memory-utilization "
                      "and the others' share must add up to less than the whole GPU."])
