"""The fixes an experienced engineer would choose, on the real logs of logs_corpus/ run through the engine
(remedy_context, tests/remedies/conftest.py): no flag added at vLLM's default, every alternative a whole fix
with its cost, the knob the user turned first, a parallel size near the one asked for, headroom below a
computed limit."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.remedies import memory
from vllm_doctor.remedies import parallel as P
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "logs_corpus"
MODELS = ROOT / "tests" / "fixtures" / "models"
TP, PP, MML, UTIL = "--tensor-parallel-size", "--pipeline-parallel-size", "--max-model-len", "--gpu-memory-utilization"
KV_BYTES = "--kv-cache-memory-bytes"


def log(path: str) -> str:
    return (CORPUS / path).read_text(encoding="utf-8", errors="replace")


def model_facts(name: str | None = None, **more) -> Facts:
    facts = Facts()
    if name:
        load_model_facts(str(MODELS / name), facts)
    for key, value in more.items():
        facts.set(key.replace("__", "."), value, "user")
    return facts


def every_edit_list(fix) -> list[list]:
    return [fix.edits] + [a.edits for a in fix.alternatives]


def value_of(edits, flag):
    return next((e.value for e in edits if isinstance(e, SetFlag) and e.flag == flag), None)


# --------------------------------------------------------------------------- 1. no flag at vLLM's default

def test_tp_fix_adds_no_pipeline_flag_at_its_default(remedy_context):
    # vicuna-13b at -tp 3 on 3 GPUs: the fix is -tp 2, not `-tp 2 --pipeline-parallel-size 1`
    ctx = remedy_context(log("parallel/vicuna13b-tp3.log"), facts=model_facts("vicuna-13b", gpu__count=3))
    fix = P.fix_tensor_parallel(ctx)
    assert fix.edits == [SetFlag(TP, "2")]
    for edits in every_edit_list(fix):
        assert SetFlag(PP, "1") not in edits
    # the pipeline alternatives still say their stages
    assert [SetFlag(TP, "1"), SetFlag(PP, "3")] in every_edit_list(fix)


def test_back_to_one_stage_removes_the_users_pipeline_flag(remedy_context):
    # real032/r03: `--tensor-parallel-size 6 --pipeline-parallel-size 2` for 40 heads; one stage of tp 8 drops -pp
    fix = P.fix_tensor_parallel(remedy_context(log("real032/r03-tp6-pp2-tiny40.log")))
    assert fix.edits[0] == SetFlag(TP, "8")
    assert RemoveFlag(PP) in fix.edits and not any(isinstance(e, SetFlag) and e.flag == PP for e in fix.edits)


# --------------------------------------------------------------------------- 2. every alternative states its cost

def _corpus_reports():
    """(case name, CLI arguments) for every corpus log, the arguments tests/test_corpus.py runs it with."""
    for cases_file in sorted(CORPUS.rglob("cases.toml")):
        for case in tomllib.loads(cases_file.read_text())["case"]:
            args = ["--format", "json", "--no-live"]
            if case.get("model"):
                args += ["--model", str(MODELS / case["model"])]
            if case.get("snapshot"):
                args += ["--facts", str(cases_file.parent / case["snapshot"])]
            if case.get("cmd"):
                args += ["--cmd", case["cmd"]]
            yield f"{cases_file.parent.relative_to(CORPUS)}/{case['id']}", \
                args + [str(cases_file.parent / (case.get("file") or f"{case['id']}.log"))]


def test_every_alternative_in_the_corpus_states_its_cost(capsys):
    from vllm_doctor.cli.main import main

    missing, seen = [], 0
    for name, args in _corpus_reports():       # in this process (the CLI's own main): ~10 s for the corpus
        capsys.readouterr()
        main(args)
        report = json.loads(capsys.readouterr().out)
        for finding in report["findings"]:
            for alt in (finding.get("fix") or {}).get("alternatives") or []:
                seen += 1
                _, sep, cost = alt["summary"].rpartition(" (cost: ")
                if not sep or not cost.rstrip(")").strip():
                    missing.append(f"{name} [{finding['rule']}]: {alt['summary']}")
    assert seen > 100, seen         # the corpus really offers alternatives: the check is not vacuous
    assert not missing, "\n".join(missing)


# --------------------------------------------------------------------------- 3. each alternative fixes it alone

def test_fp8_kv_cache_keeps_no_context_that_does_not_fit(remedy_context):
    # real/memory m09: Llama-3.1-8B's default 131,072 context; 27,728 tokens fit. fp8 doubles that to ~55k:
    # still short of 131k, so the fp8 alternative comes with a --max-model-len that fits
    fix = memory.fix_kv_cache(remedy_context(log("memory/m09-v1-128k-default-estimate.log")))
    fp8 = next(a for a in fix.alternatives if SetFlag("--kv-cache-dtype", "fp8") in a.edits)
    length = int(value_of(fp8.edits, MML))
    assert length % 16 == 0 and length <= 2 * 27728 * 0.95
    assert f"--max-model-len {length}" in fp8.summary


def test_fp8_kv_cache_alone_when_the_context_then_fits(remedy_context):
    # memory m10: Qwen3-8B at an explicit 40,960 tokens; 22,704 fit, ~45k with fp8: no --max-model-len needed
    ctx = remedy_context(log("memory/m10-v1-085-dangling-estimate.log"), facts=model_facts("qwen3-8b"))
    fp8 = next(a for a in memory.fix_kv_cache(ctx).alternatives if SetFlag("--kv-cache-dtype", "fp8") in a.edits)
    assert fp8.edits == [SetFlag("--kv-cache-dtype", "fp8")]


def test_a_tiny_explicit_kv_size_is_never_kept(remedy_context):
    # vLLM 0.32 with --kv-cache-memory-bytes 1M: an fp8 cache or more GPUs inside 1 MiB fixes nothing
    ctx = remedy_context((ROOT / "tests/data/corpus-dev/27-kv-bytes-too-small.log").read_text())
    fix = memory.fix_kv_cache(ctx)
    assert fix.edits == [RemoveFlag(KV_BYTES)]
    for edits in every_edit_list(fix):
        assert RemoveFlag(KV_BYTES) in edits or any(isinstance(e, SetFlag) and e.flag == KV_BYTES for e in edits)


def test_an_explicit_kv_size_is_raised_to_the_need(remedy_context):
    line = ("ValueError: To serve at least one request with the model's max seq len (4096), (2.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (0.00 GiB). Based on the available memory, "
            "the estimated maximum model length is 0. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine.")
    fix = memory.fix_kv_cache(remedy_context(line, command="vllm serve m --kv-cache-memory-bytes 1M"))
    sizes = [int(value_of(edits, KV_BYTES)) for edits in every_edit_list(fix) if value_of(edits, KV_BYTES)]
    assert sizes and min(sizes) >= 2.0 * 1.05 * mm.GIB
    assert not [edits for edits in every_edit_list(fix) if value_of(edits, UTIL)]


def test_no_gpus_proposed_on_the_cpu_backend(remedy_context):
    # real032/r11: VLLM_CPU_KVCACHE_SPACE=1 on the CPU backend; 4 GiB needed. No "spread over 2 GPUs"
    fix = memory.fix_kv_cache(remedy_context(log("real032/r11-kvspace1-llama32-1b-128k.log")))
    assert not [edits for edits in every_edit_list(fix) if value_of(edits, TP)]
    assert [SetEnv("VLLM_CPU_KVCACHE_SPACE", "5")] in every_edit_list(fix)


def test_weights_filling_the_gpu_offer_nothing_that_keeps_no_room(remedy_context):
    # memory m13: the weights take the whole 0.9 share (KV -1.8 GiB). 0.95 of the card still leaves -1.07 GiB and
    # an fp8 cache halves nothing: neither is offered; more GPUs and fp8 weights free room
    ctx = remedy_context(log("memory/m13-v0-weights-fill-card-no-blocks.log"), facts=model_facts("qwen2.5-7b"))
    fix = memory.fix_kv_cache(ctx)
    assert value_of(fix.edits, TP) == "2"
    for edits in every_edit_list(fix):
        assert value_of(edits, UTIL) is None and value_of(edits, "--kv-cache-dtype") is None
    assert [SetFlag("--quantization", "fp8")] in every_edit_list(fix)


def test_fp8_weights_are_split_only_when_they_do_not_fit(remedy_context):
    # memory m01: Llama-3-70B (131 GiB) on one 80 GiB GPU. fp8 halves it to 65.7 GiB: on one GPU when the memory
    # model leaves that much room for weights at this utilization, else spread over 2 GPUs
    from vllm_doctor.vllm_math import budget
    from vllm_doctor.remedies.memory.common import sizing, total_gib, utilization

    ctx = remedy_context(log("memory/m01-v0-load-oom-70b.log"), facts=model_facts("llama-3-70b"))
    fix = memory.fix_oom_load(ctx)
    fp8 = next(a for a in fix.alternatives if SetFlag("--quantization", "fp8") in a.edits)
    room = budget.room_for_weights(sizing(ctx), budget.Launch(total_gib(ctx), 1, 1, utilization(ctx)[0], ctx.version))
    assert value_of(fp8.edits, TP) == (None if 131.4 / 2 <= room else "2"), room
    # a tighter share (0.75 of the card) leaves too little room: fp8 over 2 GPUs
    tight = budget.room_for_weights(sizing(ctx), budget.Launch(total_gib(ctx), 1, 1, 0.75, ctx.version))
    assert tight < 131.4 / 2


# --------------------------------------------------------------------------- 4. the knob the user turned first

def test_graph_capture_oom_lowers_the_raised_utilization_first(remedy_context):
    # memory m05: CUDA-graph capture OOM at --gpu-memory-utilization 0.97: back to vLLM's default 0.90 first,
    # --enforce-eager (slower decoding) as the alternative
    fix = memory.fix_oom_runtime(remedy_context(log("memory/m05-v1-tp4-one-rank-capture-oom.log")))
    assert fix.facts_used["phase"] == "graph"
    assert fix.edits == [SetFlag(UTIL, "0.90")]
    eager = next(a for a in fix.alternatives if SetFlag("--enforce-eager") in a.edits)
    assert "no CUDA graphs" in eager.cost


def test_an_explicit_context_that_does_not_fit_is_lowered_first(remedy_context):
    # the user asked for 32,768 tokens at a lowered utilization: shorten the context they set first
    line = ("ValueError: To serve at least one request with the model's max seq len (32768), (4.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (1.00 GiB). Based on the available memory, "
            "the estimated maximum model length is 8192. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine.")
    facts = {"gpu.devices": [{"index": 0, "memory_total_mib": 81920, "memory_free_mib": 81000, "processes": []}]}
    fix = memory.fix_kv_cache(remedy_context(line, facts=facts, command="vllm serve m --gpu-memory-utilization 0.5 "
                                                                        "--max-model-len 32768"))
    assert value_of(fix.edits, MML) is not None and value_of(fix.edits, UTIL) is None
    assert any(value_of(a.edits, UTIL) for a in fix.alternatives)


# --------------------------------------------------------------------------- 5. near the requested size

def test_tp_stays_near_the_requested_size(remedy_context):
    # a 13B model at -tp 3 on an 8-GPU box: -tp 4 (as near as 2, and the GPUs exist), not -tp 8
    ctx = remedy_context(log("parallel/vicuna13b-tp3.log"), facts=model_facts("vicuna-13b", gpu__count=8))
    fix = P.fix_tensor_parallel(ctx)
    assert fix.edits == [SetFlag(TP, "4")]
    assert any("nearest the requested 3" in line and "8 GPUs exist" in line for line in fix.arithmetic)
    # GPU count unknown: the user has the 3 they asked for, maybe no more -> below
    fix = P.fix_tensor_parallel(remedy_context(log("parallel/vicuna13b-tp3.log"), facts=model_facts("vicuna-13b")))
    assert fix.edits == [SetFlag(TP, "2")]


@pytest.mark.parametrize("want, above, first", [(3, True, (4, 1)), (3, False, (2, 1)), (None, True, (8, 1)),
                                                (6, True, (5, 1)), (7, True, (8, 1))])
def test_rank_plans_nearest_the_request(want, above, first):
    # 40 heads, 8 GPUs: valid tp 1, 2, 4, 5, 8 (heads only)
    assert pm.plan(8, 40, want=want, prefer_above=above)[0] == first


# --------------------------------------------------------------------------- 6. headroom below computed limits

def test_max_model_len_leaves_headroom_below_vllms_limit(remedy_context):
    # memory m08: "the maximum number of tokens that can be stored in KV cache (7344)"
    fix = memory.fix_kv_cache(remedy_context(log("memory/m08-v0-kv-token-capacity.log")))
    length = int(value_of(fix.edits, MML))
    assert length % 16 == 0 and 7344 * 0.95 - 16 <= length <= 7344 * 0.95
    assert any(f"{7344 - length} tokens of headroom" in line for line in fix.arithmetic)


@pytest.mark.parametrize("limit, block", [(7344, 16), (32768, 16), (100, 16), (2400, 256)])
def test_len_with_headroom_is_below_by_five_percent_and_a_block(limit, block):
    got = mm.len_with_headroom(limit, block)
    assert got % block == 0 and got <= limit - max(block, limit * 0.05) and got > limit * 0.95 - 2 * block
