"""The layouts a parallel remedy proposes: what is known about the launch (Setup), the edits that turn its
layout into another, and the Fix with the ranked alternatives and their costs (remedies/parallel.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from vllm_doctor.command.edits import RemoveFlag, SetFlag
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.vllm_math import budget
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.vllm_math.sizing import Sizing

TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
DP_FLAG = "--data-parallel-size"


@dataclass
class Setup:
    """The model (with the log's head counts in), the layout asked for and the GPUs there are."""
    shape: ModelShape
    tp: int = 1
    tp_known: bool = False
    pp: int = 1
    dp: int = 1
    gpus: int | None = None
    gpu_mem: int | None = None               # bytes per GPU
    weight_bytes: int | None = None          # a measured checkpoint only
    used: dict[str, Any] = field(default_factory=dict)
    arith: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    guessed: bool = False                    # the GPU bound is a guess (one server) for a size that is not real
    gpus_per_node: int | None = None         # a cluster snapshot's smallest GPU node: tp stays within a node
    replicas: bool = False                   # the release has --data-parallel-size: a model that fits is replicated
    estimate: int | None = None              # the weights' bytes from the config when no checkpoint was measured
    sizing: Sizing | None = None             # the model for the memory model (vllm_math/budget.py)
    launch: budget.Launch | None = None      # the launch's memory knobs (utilization, context, version)

    @property
    def weights(self) -> int | None:
        """The checkpoint's bytes as measured, else as estimated from config.json."""
        return self.weight_bytes or self.estimate

    def fit(self, tp: int, pp: int) -> tuple[bool | None, float, str] | None:
        """Whether (tp, pp) leaves a KV cache for one request of the context, by the memory model `check` and
        `plan` use; the weights measured, else estimated from config.json (said so). None: it cannot say."""
        weights = self.weights
        if not (weights and self.gpu_mem and self.sizing is not None and self.launch is not None):
            return None
        per_gpu = weights / (tp * pp)
        pred = budget.predict(self.sizing, replace(self.launch, total_gib=self.gpu_mem / pm.GIB, tp=tp, pp=pp,
                                                   weights_gib=per_gpu / pm.GIB))
        if pred is None:
            return None
        need = pred.max_model_len
        fits = pred.kv_tokens >= need if need else pred.kv_gib > 0
        how = "" if self.weight_bytes else " (estimated from config.json)"
        text = (f"weights ~{per_gpu / pm.GIB:.1f} GiB per GPU of {self.gpu_mem / pm.GIB:.0f} GiB{how}; KV cache "
                f"~{mm.fmt_tokens(max(pred.kv_tokens, 0))} tokens"
                + ("" if fits else f" (too little for one {need}-token request)" if need else " (none left)"))
        return fits, per_gpu, text

    def rank(self, bound: int, heads: int | None, pp_supported: bool = True, exclude: tuple[int, int] | None = None,
             sizes: list[int] | None = None) -> list[pm.Plan]:
        """Layouts on `bound` GPUs: every valid tp size, or only `sizes` (a model whose config is unknown),
        the world size nearest the one asked for first (larger on a tie only when the GPUs are known)."""
        s = self.shape
        return pm.rank_plans(bound, heads, weight_bytes=self.weight_bytes, gpu_mem_bytes=self.gpu_mem,
                             pp_supported=pp_supported and not self.guessed,   # no pipeline to fill guessed GPUs
                             num_layers=s.layers, use_mla=s.use_mla, exclude=exclude,
                             sizes=sizes, want=self.tp * self.pp if self.tp_known else None,
                             prefer_above=bool(self.gpus), gpus_per_node=self.gpus_per_node,
                             replicas=self.replicas and bool(self.gpus),
                             small=bool(self.gpu_mem and self.weights and self.weights <= self.gpu_mem / 4),
                             fit=self.fit,
                             **s.tp_kwargs())

    def guess_node(self, what: str, n: int) -> int:
        """The GPU bound when the count is unknown and the size asked for is not a real one (`-tp 80000000`):
        one common server, said so, instead of a loop as long as the number."""
        self.notes += [pm.not_a_real_size(f"the requested {what}", n),
                       f"GPU count unknown: assumed one server of {pm.GUESSED_NODE_GPUS} GPUs; pass --facts "
                       "or run on the GPU host to check how many exist"]
        self.guessed = True
        return pm.GUESSED_NODE_GPUS


def layout_flags(tp: int, pp: int, dp: int = 1) -> str:
    return f"{TP_FLAG} {tp}" + (f" {PP_FLAG} {pp}" if pp > 1 else "") + (f" {DP_FLAG} {dp}" if dp > 1 else "")


def layout_edits(k: Setup, tp: int, pp: int, dp: int = 1) -> list:
    """The edits that turn the launch's layout into (tp, pp), and none for a size it already has: no
    `--pipeline-parallel-size 1` (vLLM's default) added to a command that never set it. Back to one stage,
    the pipeline flag is removed (cleaner than `-pp 1`, and vLLM's default)."""
    edits: list = [] if k.tp_known and tp == k.tp else [SetFlag(TP_FLAG, str(tp))]
    if pp > 1 and pp != k.pp:
        edits.append(SetFlag(PP_FLAG, str(pp)))
    elif pp == 1 and k.pp > 1:
        edits.append(RemoveFlag(PP_FLAG))
    if dp > 1 and dp != k.dp:
        edits.append(SetFlag(DP_FLAG, str(dp)))
    return edits


def build_fix(k: Setup, plans: list[pm.Plan], reason: Callable[[int], str],
           extra_alternatives: list[Alternative] | None = None) -> Fix | None:
    if not plans:
        return None
    best = plans[0]
    summary = f"Use {layout_flags(best.tp, best.pp, best.replicas)} ({reason(best.tp)})"
    if k.guessed:       # idle GPUs of a guessed node say nothing: that the size asked for is none does
        summary += f"; the size asked for is not a real one (no cluster has more than {pm.MAX_CLUSTER_GPUS} GPUs)"
    elif best.replicas > 1:
        summary += f"; {best.replicas} replicas use all {best.world * best.replicas} GPUs"
    elif best.pp > 1:
        summary += f"; {best.pp} pipeline stages use all {best.world} GPUs"
        if best.fits is None and k.tp_known and best.world == k.tp * k.pp:
            # nothing says fewer stages fit: this many keep each GPU's share of the weights what was asked
            k.notes.append(f"{best.pp} pipeline stages: with GPU memory unknown, each GPU holds no more of the "
                           f"weights than with the layout asked for; --facts lets the doctor pick the fewest stages "
                           f"that fit")
    elif best.idle:
        summary += f"; {best.idle} of {best.gpus} GPUs stay idle"
    if best.pp == 1 and any(p.pp > 1 for p in plans[1:4]):
        # the alternatives below add pipeline stages; say that this layout has none (and sets no flag for it)
        summary += f"; one pipeline stage ({PP_FLAG} 1, vLLM's default)"
    alts = [Alternative(f"Use {layout_flags(p.tp, p.pp, p.replicas)}", layout_edits(k, p.tp, p.pp, p.replicas),
                        "; ".join(p.costs) or "none") for p in plans[1:4]] + list(extra_alternatives or [])
    k.arith += [f"tp={p.tp} pp={p.pp}: uses {p.world * p.replicas} GPU(s)" + (f"; {'; '.join(p.costs)}" if p.costs else "")
                for p in plans[:4]]
    if best.costs:
        k.notes.append("cost of the proposed layout: " + "; ".join(best.costs))
    why_nearest(k, plans)
    return Fix(summary=summary, edits=layout_edits(k, best.tp, best.pp, best.replicas), alternatives=alts,
               arithmetic=k.arith,
               facts_used=dict(k.used), notes=k.notes)


def why_nearest(k: Setup, plans: list[pm.Plan]) -> None:
    """Say why the first layout is the one proposed when a larger or smaller one was valid as well."""
    best, asked = plans[0], k.tp * k.pp
    if not k.tp_known or best.pp > 1 or best.world == asked:
        return
    others = sorted({p.world for p in plans if p.pp == 1 and p.world != best.world})
    if not others or abs(best.world - asked) > min(abs(w - asked) for w in others):
        return          # chosen for another reason (weights that fit, idle GPUs): its costs say which
    tie = [w for w in others if abs(w - asked) == abs(best.world - asked)]
    line = (f"{TP_FLAG} {best.tp}: the valid size nearest the requested {asked} "
            f"(also valid: {', '.join(map(str, others))})")
    if tie:
        line += (f"; {tie[0]} is as near, {best.world} is chosen because {k.gpus} GPUs exist" if best.world > asked
                 else f"; {tie[0]} is as near, but only {asked} GPU(s) are known to exist")
    k.arith.append(line)
