"""The memory checks of `check` (a part of ``checker.Checker``): the start-up free-memory check, the weights
per GPU, and the KV cache for max_model_len with the memory model's KV memory (``vllm_math.budget``, the
figures vLLM will print), as `plan` and the memory remedies size them."""
from __future__ import annotations

from typing import Any

from vllm_doctor.checks.coverage import NO_CONFIG
from vllm_doctor.command.versions import at_least
from vllm_doctor.facts import gpus
from vllm_doctor.numbers import as_float, as_int
from vllm_doctor.vllm_math import budget as mm_budget
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.sizing import GIB, parse_len


def _gib(x: float) -> str:
    return f"{x:.2f}"


class MemoryChecks:
    """Mixed into Checker: uses its facts, sizing, layout (tp, pp, chosen GPUs), version and add()."""

    prediction: mm_budget.MemoryPrediction | None = None     # set by the KV check when the model could run

    # -- memory ---------------------------------------------------------------------------------
    def memory_summary(self) -> dict[str, Any] | None:
        """The memory model's figures for this launch, per GPU, as `check --format json` gives them: what
        vLLM will print at start-up ("GPU KV cache size", "Maximum concurrency") and whether one request of
        the context fits. None when the memory check could not size the launch."""
        p = self.prediction
        if p is None:
            return None
        fits = None if not p.max_model_len else p.kv_gib > 0 and p.largest_max_model_len >= p.max_model_len
        return {"weights_gib": round(p.weights_gib, 2), "kv_cache_gib": round(max(p.kv_gib, 0.0), 2),
                "kv_cache_tokens": max(p.kv_tokens, 0), "max_model_len": p.max_model_len,
                "max_concurrency": round(p.concurrency, 2) if p.concurrency is not None else None,
                "largest_max_model_len": p.largest_max_model_len, "context_fits": fits,
                "confidence": p.confidence, "tp": self.tp, "pp": self.pp}

    def sizing_basis(self) -> dict[str, Any]:
        """What the memory checks size this launch with (vllm_math.sizing, as `plan` and the remedies):
        weight bytes and how they were found, KV-cache bytes per token per GPU for tp x pp."""
        weights = self.sizing.weights()
        kv = self.sizing.kv_per_token(self.tp, self.pp)
        return {"weight_bytes": weights.bytes, "weights_source": weights.source,
                "kv_bytes_per_token": kv.bytes if kv else None}

    def memory(self) -> str | None:
        if not self.chosen:
            return self.no_gpus
        budget = self._memory_budget()
        if isinstance(budget, str):
            return budget
        if self._free_memory_check(*budget):
            return None
        total, free, _, u = budget
        weights = self.sizing.weights()
        if not weights.bytes:
            return NO_CONFIG
        per_gpu = weights.bytes / self.world / GIB
        basis = {"weights_total_gib": round(weights.bytes / GIB, 2), "weight_bytes": weights.bytes,
                 "weights_source": weights.source, "weights_per_gpu_gib": round(per_gpu, 2),
                 "gpu_total_gib": round(total, 2), "gpu_memory_utilization": u}
        if self._weights_check(per_gpu, free if free is not None else total, weights.estimated, basis):
            return None
        self._kv_check(total, u, per_gpu, weights.estimated, basis)
        return None

    def _memory_budget(self) -> tuple[float, float | None, Any, float] | str:
        """(smallest total GiB, smallest free GiB, that GPU's index, utilization) of the GPUs used, or why
        the memory checks cannot run."""
        totals = [t for t in (gpus.total_gib(d) for d in self.chosen) if t]
        frees = [(f, d.get("index", 0)) for d in self.chosen if (f := gpus.free_gib(d)) is not None]
        if not totals:
            return "the GPUs' memory is unknown"
        given = self.facts.get("args.gpu_memory_utilization")
        u = as_float(given) if given is not None else mm.default_utilization(self.version)
        if u is None or not 0 < u <= 1:
            return "--gpu-memory-utilization is out of range"
        if self.facts.get("args.kv_cache_memory_bytes") or self.facts.get("args.cpu_offload_gb"):
            return "--kv-cache-memory-bytes / --cpu-offload-gb change the budget"
        free, idx = min(frees, key=lambda x: x[0]) if frees else (None, 0)
        return min(totals), free, idx, u

    def _free_memory_check(self, total: float, free: float | None, idx: Any, u: float) -> bool:
        """The start-up free-memory check (0.9.1+); True when it fails."""
        if free is None or not at_least(self.version, "0.9.1") or free >= u * total:
            return False
        self.add("gpu-memory-utilization-too-high",
                 f"ValueError: Free memory on device cuda:{idx} ({_gib(free)}/{_gib(total)} GiB) on startup is "
                 f"less than desired GPU memory utilization ({u:g}, {_gib(u * total)} GiB). Decrease GPU "
                 f"memory utilization or reduce GPU memory used by other processes.",
                 {"device": f"cuda:{idx}", "free_gib": _gib(free), "total_gib": _gib(total), "util": f"{u:g}",
                  "requested_gib": _gib(u * total)})
        return True

    def _weights_check(self, per_gpu: float, room: float, estimated: bool, basis: dict) -> bool:
        """The weights themselves per GPU; True when they do not fit."""
        if per_gpu <= room - 0.5:
            return False
        # vLLM 0.13+'s own wording for an OOM while loading (gpu_model_runner.py), our numbers after it
        self.add("cuda-oom-load",
                 f"Failed to load model - not enough GPU memory. (predicted: {per_gpu:.2f} GiB of weights per "
                 f"GPU, {room:.2f} GiB free for them)",
                 confidence="medium" if estimated else "high", facts=basis)
        return True

    def launch(self, total: float, u: float, per_gpu: float) -> mm_budget.Launch:
        """This command as the memory model sees it."""
        f = self.facts
        return mm_budget.Launch(total, self.tp, self.pp, u, self.version, parse_len(f.get("args.max_model_len")),
                                as_int(f.get("args.max_num_seqs")), as_int(f.get("args.max_num_batched_tokens")),
                                bool(f.get("args.enforce_eager")), as_int(f.get("args.block_size")) or mm.DEFAULT_BLOCK,
                                weights_gib=per_gpu)

    def _kv_check(self, total: float, u: float, per_gpu: float, estimated: bool, basis: dict) -> None:
        """The KV cache for one request of max_model_len, with the memory model's KV memory."""
        pred = mm_budget.predict(self.sizing, self.launch(total, u, per_gpu))
        if pred is None:
            return
        self.prediction = pred
        kv_gib = pred.kv_gib
        basis["memory_model"] = pred.as_dict()
        requested = parse_len(self.facts.get("args.max_model_len"))
        derived = self.shape.derived_max_len
        mml = min(x for x in (requested, derived) if x) if (requested or derived) else None
        if str(self.facts.get("args.max_model_len") or "") in ("auto", "-1"):
            mml = None
        kv = self.sizing.kv_per_token(self.tp, self.pp)
        bpt = kv.bytes if kv else None
        block = as_int(self.facts.get("args.block_size")) or mm.DEFAULT_BLOCK
        basis.update({"kv_budget_gib": round(kv_gib, 2), "kv_budget": pred.arithmetic() + " per GPU"})
        if pred.confidence == "low" or estimated:
            basis["memory_model_confidence"] = "low: " + "; ".join(pred.assumptions)
        if kv_gib <= 0:
            self.add("kv-cache-insufficient",
                     "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                     "when initializing the engine.",
                     {"available_gib": _gib(kv_gib), **({"max_model_len": str(mml)} if mml else {})},
                     confidence="medium" if kv_gib < -1 and not estimated else "low", facts=basis)
            return
        if not (mml and bpt):
            return
        needed = mm.kv_bytes_needed(mml, bpt, block) / GIB
        if needed <= kv_gib:
            return
        est = mm.max_len_for_budget(kv_gib * GIB, bpt, block)
        margin = (needed - kv_gib) / needed
        basis.update({"kv_bytes_per_token": bpt, "kv_needed_gib": round(needed, 2)})
        self.add("kv-cache-insufficient",
                 f"ValueError: To serve at least one request with the models's max seq len ({mml}), "
                 f"({_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
                 f"({_gib(kv_gib)} GiB). Based on the available memory, the estimated maximum model length is {est}."
                 f" Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                 f"engine.",
                 {"max_model_len": str(mml), "needed_gib": _gib(needed), "available_gib": _gib(kv_gib),
                  "estimated_max_len": str(est)},
                 confidence="medium" if margin > 0.2 and not estimated else "low", facts=basis)
