"""`vllm-doctor plan`: only layouts vLLM accepts, for every model fixture, checked against an independent
brute-force reading of vLLM's tensor-parallel rules (docs/reference/vllm-messages.md §4)."""
import json

import pytest

from conftest import ROOT, run_cli
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.facts.snapshot import save_snapshot
from vllm_doctor.checks.plan import build_plan
from vllm_doctor.vllm_math.parallel import valid_tp_sizes

MODELS = ROOT / "tests" / "fixtures" / "models"
FIXTURES = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file())


def cfg(model: str) -> dict:
    return json.loads((MODELS / model / "config.json").read_text())


def brute_force_ok(c: dict, t: int) -> bool:
    """vllm-messages.md §4 written out again from config.json, independent of parallel_math."""
    text = c.get("text_config") or c.get("llm_config") or c
    heads = text.get("num_attention_heads") or text.get("n_head")
    kv = (text.get("num_key_value_heads") or text.get("num_kv_heads") or text.get("n_head_kv")
          or (1 if text.get("multi_query") else None) or heads)
    if text.get("new_decoder_architecture") is False and text.get("multi_query"):
        kv = 1
    vocab = text.get("vocab_size")
    inter = text.get("intermediate_size") or text.get("ffn_hidden_size")
    moe = text.get("moe_intermediate_size")
    if heads % t:
        return False
    if kv and not (kv % t == 0 or t % kv == 0):
        return False
    if vocab and (-(-vocab // 64) * 64) % t:
        return False
    if inter and inter % t:
        return False
    if moe and moe % t:
        return False
    vision = c.get("vision_config") or {}
    vh = vision.get("num_attention_heads")
    if vh and vh % t:
        return False
    # AWQ/GPTQ: input_size_per_partition % group_size (vllm-messages.md, "input size is not aligned"),
    # for the MLP's down_proj and attention's o_proj
    group = (c.get("quantization_config") or {}).get("group_size") or 0
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    if group > 0 and ((inter // t) % group or (heads * head_dim // t) % group):
        return False
    return True


def facts_for(model: str) -> Facts:
    f = Facts()
    assert load_model_facts(str(MODELS / model), f) is None or f.get("model.num_attention_heads")
    return f


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 5, 6, 7, 8, 16])
def test_plan_proposes_only_sizes_vllm_accepts(model, gpus):
    f = facts_for(model)
    result = build_plan(f, model, gpus, 80.0)
    heads = f.get("model.num_attention_heads")
    kw = dict(kv_heads=f.get("model.num_kv_heads"), vocab=f.get("model.vocab_size"),
              intermediate=f.get("model.intermediate_size"), moe_intermediate=f.get("model.moe_intermediate_size"),
              vision_heads=f.get("model.vision_num_heads"), head_dim=f.get("model.head_dim"),
              quant_group=f.get("model.quant_group_size"))
    valid = valid_tp_sizes(heads, max_tp=gpus, **kw)
    c = cfg(model)
    assert result.layouts, model
    for lay in result.layouts:
        assert lay.tp in valid, (model, lay.tp)
        assert brute_force_ok(c, lay.tp), (model, lay.tp)
        assert lay.tp * lay.pp <= gpus
    # every valid tp appears, and the best one's command carries it
    assert {lay.tp for lay in result.layouts} == set(valid)
    best = result.best
    assert f"--tensor-parallel-size {best.tp}" in best.command
    assert ("--pipeline-parallel-size" in best.command) == (best.pp > 1)


def test_popular_guess_is_never_proposed():
    # 40 heads (vicuna-13b) on 16 GPUs: "largest power of two" = 16 is rejected (40 % 16 = 8), and so is
    # "ceil(memory / per-GPU)" = 3 on 3 small GPUs; 5 and 10 divide the heads but not intermediate_size 13824
    r = build_plan(facts_for("vicuna-13b"), "vicuna-13b", 16, 80.0)
    assert 16 not in {lay.tp for lay in r.layouts} and r.valid_tp == [1, 2, 4, 8]
    r = build_plan(facts_for("vicuna-13b"), "vicuna-13b", 3, 16.0)
    assert 3 not in {lay.tp for lay in r.layouts}
    # 28 heads (qwen2.5-7b): 8 is rejected, 4 is the largest valid
    r = build_plan(facts_for("qwen2.5-7b"), "qwen2.5-7b", 8, 24.0)
    assert r.valid_tp == [1, 2, 4] and (r.best.tp, r.best.replicas) == (1, 8)      # fits one GPU: 8 replicas


def test_seed_case_three_gpus():
    r = build_plan(facts_for("vicuna-13b"), "vicuna-13b", 3, 40.0)
    assert [(x.tp, x.pp) for x in r.layouts][:2] == [(1, 1), (2, 1)]
    assert (1, 3) in [(x.tp, x.pp) for x in r.layouts]
    assert all(x.tp != 3 for x in r.layouts)


def test_unknown_gpu_memory_prefers_more_gpus():
    # llama-3-70b (~131 GiB) on 3 GPUs of unknown size: one GPU is the worst guess, two are the best TP
    r = build_plan(facts_for("llama-3-70b"), "llama-3-70b", 3, None)
    assert all(x.fits is None for x in r.layouts)
    assert (r.best.tp, r.best.pp) == (2, 1)
    order = [(x.tp, x.pp) for x in r.layouts]
    assert order.index((2, 1)) < order.index((1, 1))


def test_memory_ranking_and_kv_capacity():
    # falcon-40b (~108 GiB bf16) on 4 x 80 GiB: tp 1 does not fit, tp 4 fits with the largest KV capacity
    r = build_plan(facts_for("falcon-40b"), "falcon-40b", 4, 80.0)
    by = {(x.tp, x.pp): x for x in r.layouts}
    assert by[(1, 1)].fits is False and r.layouts[-1].fits is False
    assert (r.best.tp, r.best.pp, r.best.replicas) == (2, 1, 2) and r.best.fits     # the fewest GPUs, twice
    assert by[(4, 1)].kv_tokens > by[(2, 1)].kv_tokens > 0
    # KV tokens = floor(KV memory / bytes per token / 16) * 16, bytes per token from the config, KV memory
    # what the memory model leaves of 0.92 x 80 GiB after the weights and the overheads it states
    bpt = 2 * 60 * max(1, 8 // 4) * 64 * 2
    m = by[(4, 1)].memory
    assert m.kv_bytes_per_token == bpt
    budget = 0.92 * 80 - by[(4, 1)].weights_per_gpu - m.activation_gib - m.non_torch_gib - m.cuda_graph_gib
    assert 0 < m.activation_gib + m.non_torch_gib + m.cuda_graph_gib < 6
    assert by[(4, 1)].kv_tokens == int(budget * (1 << 30) // bpt) // 16 * 16


def test_nothing_fits_says_so():
    r = build_plan(facts_for("deepseek-v3"), "deepseek-v3", 2, 24.0)
    assert all(x.fits is False for x in r.layouts)
    assert r.best.world == 2           # the least short layout first
    assert any("no layout fits" in n for n in r.notes)


def test_topology_domains_rank_in_domain_first(tmp_path, fake_nvml):
    f = facts_for("llama-2-13b")
    collect_gpu_facts(f, fake_nvml.a100_pcie_x3(), environ={})
    r = build_plan(f, "llama-2-13b", 3, 40.0)
    assert r.domains and "PCIe" in r.domains
    by = {(x.tp, x.pp): x for x in r.layouts}
    assert by[(2, 1)].in_domain is True


def _cli(*args):
    r = run_cli(*args)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def test_cli_json_and_table(tmp_path, fake_nvml):
    rc, out, err = _cli("plan", str(MODELS / "vicuna-13b"), "--gpus", "3", "--gpu-memory", "40",
                        "--no-live", "--format", "json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["valid_tensor_parallel_sizes"] == [1, 2]
    assert data["best"]["tp"] == 1 and data["best"]["command"].endswith("--tensor-parallel-size 1 --data-parallel-size 3")
    rc, out, err = _cli("plan", str(MODELS / "vicuna-13b"), "--gpus", "3", "--gpu-memory", "40", "--no-live")
    assert rc == 0 and "\x1b[" not in out and "best:" in out and "KV tokens" in out
    facts = Facts()
    collect_gpu_facts(facts, fake_nvml.h100_sxm_x8(), environ={})
    snap = tmp_path / "h100.json"
    snap.write_text(json.dumps(save_snapshot(facts)))
    rc, out, err = _cli("plan", str(MODELS / "llama-3-70b"), "--facts", str(snap), "--no-live", "--format", "json")
    data = json.loads(out)
    assert rc == 0 and data["gpus"] == 8 and round(data["gpu_memory_gib"]) == 80
    assert (data["best"]["tp"], data["best"]["replicas"]) == (4, 2) and data["best"]["within_one_domain"] is True


@pytest.mark.parametrize("args", [["/nonexistent-model", "--gpus", "2"], [str(MODELS / "vicuna-13b"), "--gpus", "0"],
                                  [str(MODELS / "vicuna-13b"), "--gpus", "2", "--max-model-len", "xx"],
                                  [str(MODELS / "vicuna-13b"), "--no-live"]])
def test_cli_bad_input(args):
    rc, out, err = _cli("plan", *args)
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err


def test_an_operator_ranking_fewest_gpus_per_replica_then_replicas():
    """Issue: fits first, no pipeline stages for a model that fits without, room for two requests of the
    context, then the fewest GPUs per replica served as replicas (`--data-parallel-size` from vLLM 0.8.3, one
    server per replica before), then KV tokens. llama-3-70b on 8 x 80 GiB: tp=2 fits but holds 1.6 requests of
    8k, so tp=4 twice; vicuna-13b on 16 GPUs: one GPU each, 16 replicas, never pipeline stages."""
    r = build_plan(facts_for("llama-3-70b"), "llama-3-70b", 8, 80.0, 8192)
    by = {(x.tp, x.pp): x for x in r.layouts}
    assert by[(2, 1)].fits and by[(2, 1)].concurrency < 2
    assert (r.best.tp, r.best.pp, r.best.replicas) == (4, 1, 2)
    assert r.best.command.endswith("--tensor-parallel-size 4 --max-model-len 8192 --data-parallel-size 2") or \
        "--data-parallel-size 2" in r.best.command
    r = build_plan(facts_for("vicuna-13b"), "vicuna-13b", 16, 80.0)
    assert (r.best.tp, r.best.pp, r.best.replicas) == (1, 1, 16)
    assert all(x.pp == 1 for x in r.layouts[:4])
    old = facts_for("vicuna-13b")
    old.set("vllm.version", "0.7.3", "user")
    r = build_plan(old, "vicuna-13b", 4, 80.0)
    assert "--data-parallel-size" not in r.best.command and any("one server per replica" in n for n in r.best.notes)
