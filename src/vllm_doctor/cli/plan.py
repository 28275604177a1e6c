"""`vllm-doctor plan MODEL`: parse, gather the facts, rank the layouts (checks/plan.py), print."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vllm_doctor.checks.plan import PlanError, PlanResult, build_plan
from vllm_doctor.cli.common import command_parser, fail, internal_error
from vllm_doctor.facts import Facts
from vllm_doctor.numbers import as_int as _int
from vllm_doctor.numbers import finite_float, json_safe
from vllm_doctor.reports.plan_text import render_text
from vllm_doctor.facts import gpus as gpu_facts
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.vllm_math.sizing import parse_len


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "plan", "Every (tensor, pipeline)-parallel layout vLLM accepts for MODEL on these GPUs, ranked, with the "
                "`vllm serve` command for the best one.",
        ["vllm-doctor plan meta-llama/Llama-2-13b-hf --gpus 3 --gpu-memory 40",
         "vllm-doctor plan Qwen/Qwen2.5-7B-Instruct --format json"])
    p.add_argument("model", metavar="MODEL", help="model directory (or cached hub id) with a config.json")
    # the ranges are checked below (PlanError: one line); the types refuse what is no number (`nan`, `inf`)
    p.add_argument("--gpus", type=int, metavar="N", help="GPUs to plan for (default: this machine's / --facts)")
    p.add_argument("--gpu-memory", type=finite_float, metavar="GiB", help="memory per GPU in GiB (default: from facts)")
    p.add_argument("--max-model-len", metavar="L", help="context length to fit (default: the model's maximum)")
    p.add_argument("--gpu-memory-utilization", type=finite_float, metavar="U",
                   help="fraction of each GPU vLLM may use")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help="plan for this vLLM release (default: installed)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--all", action="store_true", help="also list the layouts that do not fit in memory")
    p.add_argument("--facts", metavar="SNAPSHOT", help="facts snapshot of the target machine")
    p.add_argument("--no-live", action="store_true", help="do not look at this machine's GPUs")
    p.add_argument("--online", action="store_true", help="allow Hugging Face hub look-ups")
    p.add_argument("--no-color", action="store_true", help="plain output (also when NO_COLOR is set)")
    return p


def plan_from_args(args, *, nvml: Any = None, environ: Any = None) -> PlanResult:
    from vllm_doctor.facts.gather import gather_facts

    if args.gpus is not None and not pm.real_size(args.gpus):
        raise PlanError("--gpus must be at least 1" if args.gpus < 1 else pm.not_a_real_size("--gpus", args.gpus))
    facts = Facts()
    if args.vllm_version:
        facts.set("vllm.version", args.vllm_version, "user")
    if args.gpus is not None:
        facts.set("gpu.count", args.gpus, "user")
    live = not args.no_live and not args.facts and (args.gpus is None or args.gpu_memory is None)  # a snapshot replaces
    notices = gather_facts(facts, table=True, model=args.model, online=args.online, live=live, snapshot=args.facts,
                           environ=environ, nvml=nvml) or []
    if not facts.get("model.num_attention_heads"):
        raise PlanError(notices[0] if notices else f"no model config for {args.model!r}")
    gpus = args.gpus if args.gpus is not None else _int(facts.get("gpu.count"))
    if not gpus:
        raise PlanError("no GPUs known: pass --gpus N (and --gpu-memory GiB), --facts SNAPSHOT, or run on the GPU host")
    if not pm.real_size(gpus):       # a snapshot claiming 10**12 GPUs
        raise PlanError(pm.not_a_real_size(f"the GPU count ({facts.source('gpu.count') or 'facts'})", gpus)
                        + ": pass --gpus N")
    gpu_gib = args.gpu_memory
    if gpu_gib is None:
        sizes = [g for g in (gpu_facts.total_gib(d) for d in gpu_facts.devices(facts)[:gpus]) if g]
        gpu_gib = min(sizes) if sizes else None
    if gpu_gib is not None and gpu_gib <= 0:
        raise PlanError("--gpu-memory must be positive")
    util = args.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise PlanError("--gpu-memory-utilization must be in (0, 1]")
    mml = None
    if args.max_model_len is not None:
        mml = parse_len(args.max_model_len)
        if not mml or mml < 1:
            raise PlanError(f"--max-model-len {args.max_model_len!r} is not a positive length")
    result = build_plan(facts, args.model, gpus, gpu_gib, mml, util)
    result.notes = [n for n in notices if n] + result.notes
    return result


def cmd_plan(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        result = plan_from_args(args)
    except PlanError as exc:
        return fail(str(exc))
    except Exception as exc:  # snapshot errors and the like: one line, never a traceback
        return internal_error(exc)
    if args.format == "json":
        sys.stdout.write(json.dumps(json_safe(result.as_dict()), indent=2, allow_nan=False) + "\n")
    else:
        color = not args.no_color and not os.environ.get("NO_COLOR") and sys.stdout.isatty()
        from vllm_doctor.reports.text import terminal_width

        sys.stdout.write(render_text(result, color, show_all=args.all, width=terminal_width(sys.stdout)))
    sys.stdout.flush()
    return 0 if result.best and result.best.fits is not False else 1
