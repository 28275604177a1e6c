"""The parallel remedies and the `A is not divisible by B` refine hook, on real log lines run through the engine
(remedy_context / diagnose, tests/remedies/conftest.py), with the model facts of the config.json fixtures."""
from pathlib import Path

import pytest

from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.remedies import parallel as P

TP, PP = "--tensor-parallel-size", "--pipeline-parallel-size"
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
VICUNA = {"model.num_attention_heads": 40, "model.num_kv_heads": 40, "model.vocab_size": 32000,
          "model.intermediate_size": 13824}


def heads_line(heads, tp):
    return f"ValueError: Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."


def divide_line(a, b):
    return f"AssertionError: {a} is not divisible by {b}"


def model_facts(name, **more):
    facts = Facts()
    load_model_facts(str(MODELS / name), facts)
    for key, value in more.items():
        facts.set(key.replace("__", "."), value, "user")
    return facts


def test_heads_from_captures_only(remedy_context):
    fix = P.fix_tensor_parallel(remedy_context(heads_line(40, 3)))
    assert fix.edits[0] == SetFlag(TP, "2")
    assert "--tensor-parallel-size 2" in fix.summary and "40" in fix.summary
    assert "attention heads: 40 % 3 = 1 -> --tensor-parallel-size 3 is rejected" in fix.arithmetic
    assert "divisors of 40 attention heads: 1, 2, 4, 5, 8, 10, 20, 40" in fix.arithmetic
    assert any("GPU count unknown" in n for n in fix.notes)
    alt = [(a.summary, a.edits) for a in fix.alternatives]
    assert ("Use --tensor-parallel-size 1 --pipeline-parallel-size 3", [SetFlag(TP, "1"), SetFlag(PP, "3")]) in alt


def test_heads_only_known_proposes_powers_of_two(remedy_context):
    # 6 GPUs, 40 heads: 5 divides the heads but fails Llama-2-13B's MLP; without a config, stay at 4
    fix = P.fix_tensor_parallel(remedy_context(heads_line(40, 6), facts={"gpu.count": 6}))
    assert fix.edits[0] == SetFlag(TP, "4")


def test_heads_with_full_facts_and_memory(remedy_context):
    facts = dict(VICUNA, **{"gpu.count": 3, "model.weight_bytes": 26 << 30,
                            "gpu.devices": [{"memory_total_mib": 24 << 10}] * 3})
    fix = P.fix_tensor_parallel(remedy_context(heads_line(40, 3), facts=facts))
    assert fix.edits == [SetFlag(TP, "2")]      # no --pipeline-parallel-size 1: vLLM's default, never set
    assert "GPUs available: 3" in fix.arithmetic
    assert any(line.startswith("tp=3 fails: attention heads: 40 % 3 = 1; vocabulary (32000): 32000 % 3 = 2")
               for line in fix.arithmetic)
    assert "valid --tensor-parallel-size values up to 3: 1, 2" in fix.arithmetic
    assert any("weights ~13.0 GiB per GPU of 24 GiB" in line for line in fix.arithmetic)
    assert fix.facts_used["attention_heads"] == "40 (log)"
    assert fix.facts_used["vocab_size"] == "32000 (model.vocab_size, user)"


def test_heads_llama3_70b_eight_gpus(remedy_context):
    ctx = remedy_context("    assert self.total_num_heads % tp_size == 0", facts=model_facts("llama-3-70b", gpu__count=8),
                         command="vllm serve meta-llama/Meta-Llama-3-70B -tp 6")
    fix = P.fix_tensor_parallel(ctx)
    # pp stays at vLLM's default (not written out); 4 and 8 are as near the requested 6, and 8 GPUs exist
    assert fix.edits == [SetFlag(TP, "8")]
    assert [a.edits for a in fix.alternatives[:2]] == [[SetFlag(TP, "4")], [SetFlag(TP, "4"), SetFlag(PP, "2")]]
    assert any("4 is as near, 8 is chosen because 8 GPUs exist" in line for line in fix.arithmetic)
    assert "64 attention heads divide by 8" in fix.summary
    assert fix.facts_used["vocab_size"] == "128256 (model.vocab_size, config.json)"


def test_kv_bare_assert_with_config(remedy_context):
    facts = {"model.num_attention_heads": 40, "model.num_kv_heads": 8, "model.vocab_size": 32000,
             "model.intermediate_size": 14080, "args.tensor_parallel_size": 5, "gpu.count": 5}
    fix = P.fix_kv_heads(remedy_context("    assert self.total_num_kv_heads % tp_size == 0", facts=facts))
    assert fix.edits[0] == SetFlag(TP, "4")
    assert fix.arithmetic[0] == "KV heads: 8 % 5 = 3 (K >= tp: KV heads are split, so tp must divide 8)"
    assert "8 KV heads split 2 per GPU" in fix.summary


def test_kv_replication_branch_from_divide_message(remedy_context):
    # "12 is not divisible by 8": tp=12 known, so K=8 (tp % K branch)
    ctx = remedy_context(divide_line(12, 8), facts={"args.tensor_parallel_size": 12, "model.num_attention_heads": 48},
                         rule="tp-kv-heads-indivisible")
    fix = P.fix_kv_heads(ctx)
    assert fix.arithmetic[0].startswith("KV heads: 12 % 8 = 4 (K < tp")
    assert fix.edits[0] == SetFlag(TP, "8")


def test_kv_dcp_message(remedy_context):
    ctx = remedy_context("ValueError: Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (4) to be "
                         "greater than the model's total number of KV heads (8). Increase `--tensor-parallel-size` or "
                         "set `--decode-context-parallel-size 1`.",
                         facts={"gpu.count": 16, "model.num_attention_heads": 64})
    fix = P.fix_kv_heads(ctx)
    assert fix.edits == [SetFlag("--decode-context-parallel-size", "1")]
    assert fix.alternatives[0].edits == [SetFlag(TP, "16")]


def test_shape_vocab_with_and_without_config(remedy_context):
    bare = P.fix_shape(remedy_context(divide_line(152064, 5)))
    assert bare.edits[0] == SetFlag(TP, "4")
    assert "a sharded dimension 152064: 152064 % 5 = 4 -> tp=5 cannot shard it" in bare.arithmetic
    full = P.fix_shape(remedy_context(divide_line(152064, 5), facts=model_facts("qwen2.5-32b")))
    assert "vocabulary 152064: 152064 % 5 = 4 -> tp=5 cannot shard it" in full.arithmetic
    assert full.edits[0] == SetFlag(TP, "4")


def test_shape_marlin_group_straddle_needs_pipeline(remedy_context):
    ctx = remedy_context("ValueError: Weight input_size_per_partition = 3696 is not divisible by group_size = 128. "
                         "Consider reducing tensor_parallel_size or running with --quantization gptq.",
                         facts={"args.tensor_parallel_size": 8, "gpu.count": 8})
    fix = P.fix_shape(ctx)
    assert fix.edits == [SetFlag(TP, "1"), SetFlag(PP, "8")]
    assert fix.arithmetic[0] == ("input size per partition 3696 % group/tile 128 = 112 "
                                 "(full input 29568 = 3696 x tp 8)")
    # the group straddles ranks: the plain GPTQ kernels refuse it too (gptq.py's alignment check), so vLLM's own
    # hint is not offered; the owners' fix is: pad to a multiple of group x tp (29568 -> 29696) and keep tp 8
    assert not any(SetFlag("--quantization", "gptq") in a.edits for a in fix.alternatives)
    pad = next(a for a in fix.alternatives if a.summary.startswith(f"Keep {TP} 8"))
    assert "padded to 29696" in pad.summary and "29696 = 29 x 1024" in pad.summary
    assert any("fewest stages that fit" in n for n in fix.notes)      # why all 8: memory unknown


def test_shape_marlin_tile_keeps_the_plain_gptq_kernels(remedy_context):
    """A Marlin tile (min_thread_k) is Marlin's own: the plain kernels take the same shards."""
    ctx = remedy_context("ValueError: Weight input_size_per_partition = 14784 is not divisible by min_thread_k = 128. "
                         "Consider reducing tensor_parallel_size or running with --quantization gptq.",
                         facts={"args.tensor_parallel_size": 2, "gpu.count": 2})
    fix = P.fix_shape(ctx)
    assert any(SetFlag("--quantization", "gptq") in a.edits for a in fix.alternatives)


def test_shape_awq_group_size_rules_out_tp(remedy_context):
    # Qwen3-32B-AWQ on 16 GPUs: 25600 / 16 = 1600 is not a multiple of the 128-wide groups, 8 is the largest tp
    ctx = remedy_context("ValueError: The input size is not aligned with the quantized weight shape. This can be caused "
                         "by too large tensor parallel size.", facts=model_facts("qwen3-32b-awq", gpu__count=16),
                         command="vllm serve Qwen/Qwen3-32B-AWQ -tp 16")
    fix = P.fix_shape(ctx)
    assert fix.edits[0] == SetFlag(TP, "8")
    assert any("quantization groups: intermediate_size/tp = 25600/16 = 1600; 1600 % 128 = 64" in line
               for line in fix.arithmetic)
    assert fix.facts_used["quant_group_size"] == 128


def test_pp_unsupported_drops_pp(remedy_context):
    ctx = remedy_context("NotImplementedError: Pipeline parallelism is not supported for this model. Supported models "
                         "implement the `SupportsPP` interface.",
                         facts={"args.tensor_parallel_size": 2, "args.pipeline_parallel_size": 2,
                                "model.num_attention_heads": 32, "model.num_kv_heads": 8})
    fix = P.fix_pp_unsupported(ctx)
    assert fix.edits == [SetFlag(TP, "4"), RemoveFlag(PP)]
    assert "drop --pipeline-parallel-size" in fix.summary
    assert "requested world size: tp 2 x pp 2 = 4" in fix.arithmetic


def test_exceeds_gpus_world_size_message(remedy_context):
    ctx = remedy_context("ValueError: World size (8) is larger than the number of available GPUs (4) in this node. If "
                         "this is intentional and you are using:", facts={"args.tensor_parallel_size": 8})
    fix = P.fix_exceeds_gpus(ctx)
    assert fix.edits[0] == SetFlag(TP, "4")
    assert "world size = tp 8 x pp 1 = 8" in fix.arithmetic and "GPUs available: 4 < 8" in fix.arithmetic
    assert any(a.edits == [SetFlag("--distributed-executor-backend", "ray")] for a in fix.alternatives)
    assert all(p.tp * p.pp <= 4 for p in P.gather(ctx).rank(4, None, sizes=[1, 2, 4]))


def test_exceeds_gpus_count_from_a_later_warning_match(remedy_context):
    ctx = remedy_context([
        "(EngineCore_DP0 pid=34) WARNING 03-30 14:11:45 [ray_utils.py:352] Tensor parallel size (4) exceeds available "
        "GPUs (2). This may result in Ray placement group allocation failures.",
        "(EngineCore_DP0 pid=89) ERROR 04-20 18:08:14 [core.py:1100] ValueError: Cannot provide a placement group "
        "requiring 4.0 GPUs (placement_group_specs=[{'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}]) within "
        "1800 seconds."])
    assert P.fix_exceeds_gpus(ctx).edits[0] == SetFlag(TP, "2")


# ----------------------------------------------------------------- refine hook

def test_classify_by_numbers(diagnose):
    def rule(a, b, **facts):
        return diagnose(divide_line(a, b), facts={k.replace("__", "."): v for k, v in facts.items()}).findings[0].rule

    assert rule(8, 5, args__tensor_parallel_size=5) == "tp-kv-heads-indivisible"
    assert rule(6, 4, args__tensor_parallel_size=6) == "tp-kv-heads-indivisible"
    assert rule(152064, 5, args__tensor_parallel_size=5) == "tp-shape-indivisible"
    assert rule(8, 5) == "tp-kv-heads-indivisible"          # no config at all
    assert rule(13824, 5) == "tp-shape-indivisible"
    assert rule(8, 5, model__num_kv_heads=8, args__tensor_parallel_size=5) == "tp-kv-heads-indivisible"
    assert rule(25, 4, model__vision_num_heads=25) == "tp-heads-indivisible"


def divide_traceback(caller_file, caller_code, a, b):
    """The traceback of vLLM's divide() called from `caller_file`: ensure_divisibility's assert, innermost last."""
    frames = [(caller_file, "__init__", caller_code), ("vllm/distributed/utils.py", "divide",
                                                       "ensure_divisibility(numerator, denominator)"),
              ("vllm/distributed/utils.py", "ensure_divisibility",
               'assert numerator % denominator == 0, "{} is not divisible by {}".format(')]
    lines = ["Traceback (most recent call last):"]
    for path, func, code in frames:
        lines += [f'  File "/usr/local/lib/python3.12/dist-packages/{path}", line 12, in {func}', f"    {code}"]
    return lines + [divide_line(a, b)]


def test_classify_by_traceback_frames(diagnose):
    vit = divide_traceback("vllm/model_executor/models/intern_vit.py",
                           "self.num_heads_per_partition = divide(self.num_heads, self.tp_size)", 25, 4)
    assert diagnose(vit).findings[0].rule == "tp-heads-indivisible"
    qkv = divide_traceback("vllm/model_executor/layers/linear.py",
                           "self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)", 8, 5)
    assert diagnose(qkv).findings[0].rule == "tp-kv-heads-indivisible"
    vocab = divide_traceback("vllm/model_executor/layers/vocab_parallel_embedding.py",
                             "per_partition_vocab_size = divide(global_vocab_size, world_size)", 64, 3)
    assert diagnose(vocab).findings[0].rule == "tp-shape-indivisible"


AUTOSCALER = ("(autoscaler +13s) Error: No available node types can fulfill resource request {{'node:{pinned}': 0.001, "
              "'GPU': 1.0}}. Add suitable node types to this cluster to resolve this issue.")
JOINED = "2025-03-03 22:56:06,173 INFO worker.py:1636 -- Connecting to existing Ray cluster at address: {ray}:6379..."


@pytest.mark.parametrize("pinned, ray, rule", [
    ("111.6.168.225", "172.16.1.2", "nccl-network"),       # a public VLLM_HOST_IP, Ray on the private network
    ("10.0.0.7", "192.168.1.2", "nccl-network"),           # two private blocks: not one network
    ("172.16.1.2", "172.16.1.2", "parallel-exceeds-gpus"),  # the head itself: no free GPU there
    ("172.16.1.9", "172.16.1.2", "parallel-exceeds-gpus"),  # another node of the same network
    ("111.6.168.225", None, "parallel-exceeds-gpus"),      # no Ray address in the log: nothing to compare
    ("<IP>", None, "nccl-network"),                        # vllm#7815: the paste hid it; only the label can be missing
    ("ec2-3-91-1-2.us-west-2.compute.amazonaws.com", "172.31.42.4", "nccl-network"),   # vllm#12670: a host name
])
def test_a_bundle_pinned_to_an_address_ray_does_not_know_is_the_network(diagnose, pinned, ray, rule):
    """vLLM pins its first bundle to `node:<driver IP>` (VLLM_HOST_IP or the default route's address) after checking
    that its own Ray node has a free GPU; Ray names nodes after the address they registered with. The pinned bundle
    unplaceable is nccl-network where the pin is no address (a host name), one the paste hid, or an address outside
    every block of the Ray addresses the log shows; its fix gives VLLM_HOST_IP the cluster's address. One block
    proves nothing."""
    lines = ([JOINED.format(ray=ray)] if ray else []) + [AUTOSCALER.format(pinned=pinned)]
    d = diagnose("\n".join(lines))
    assert [f.rule for f in d.findings][:1] == [rule]
    if rule == "nccl-network":
        assert d.findings[0].fix.edits == ([SetEnv("VLLM_HOST_IP", ray)] if ray else [])
        assert "VLLM_HOST_IP" in d.findings[0].fix.summary


@pytest.mark.parametrize("pinned", ["<IP>", "111.6.168.225"])
def test_vllms_own_count_keeps_a_pinned_bundle_a_count_problem(diagnose, pinned):
    """vLLM warns before it asks Ray when the cluster has fewer GPUs than the group (vllm#14111's log has it beside a
    pinned bundle Ray could not place): the count explains the wait, whatever the pin."""
    warning = ("WARNING 03-03 03:06:13 ray_utils.py:315] The number of required GPUs exceeds the total number of "
               "available GPUs in the placement group.")
    d = diagnose("\n".join([JOINED.format(ray="10.21.9.33"), warning, AUTOSCALER.format(pinned=pinned)]))
    assert [f.rule for f in d.findings][:1] == ["parallel-exceeds-gpus"]


def test_the_drivers_own_gpu_count_says_nothing_of_the_cluster(diagnose):
    """0.11+'s `Tensor parallel size (N) exceeds available GPUs (M)` counts the driver's GPUs before it joins Ray
    (initialize_ray_cluster: cuda_device_count_stateless), so every multi-node start prints it (real t402: two nodes
    of one GPU, TP 2): the pin outside the cluster's block stays the network's."""
    warning = ("(EngineCore_DP0 pid=89) WARNING 11-03 06:10:19 [ray_utils.py:352] Tensor parallel size (16) exceeds "
               "available GPUs (8). This may result in Ray placement group allocation failures.")
    d = diagnose("\n".join([JOINED.format(ray="10.21.9.33"), warning, AUTOSCALER.format(pinned="111.6.168.225")]))
    assert [f.rule for f in d.findings][:1] == ["nccl-network"]


PG_WAIT = ("(EngineCore pid=84) INFO 06-07 18:13:55 [ray_utils.py:464] Waiting for creating a placement group of specs "
           "for 150 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status` and `ray list nodes` to see if you "
           "have enough resources.")
STATUS = ["Resources", "Total Usage:", " 0.0/34.0 CPU", " 0.0/{total} GPU", "Pending Demands:",
          " {{'GPU': 1.0}} * 2 (PACK): 1+ pending placement groups"]


@pytest.mark.parametrize("total, rule", [("1.0", "parallel-exceeds-gpus"), ("2.0", "startup-stalled"),
                                         (None, "startup-stalled")])
def test_a_pasted_ray_status_names_the_count_only_below_what_the_group_asks(diagnose, total, rule):
    """`ray status` beside vLLM's placement-group wait: 1 GPU counted against {'GPU': 1.0} * 2 pending is
    parallel-exceeds-gpus, the wait its support (no second finding); with 2 GPUs counted, or no total at all,
    the pending line says nothing about why and the start-up stall stands."""
    status = [ln.format(total=total) for ln in STATUS if total or "GPU" not in ln or "Pending" in ln or "*" in ln]
    d = diagnose("\n".join([PG_WAIT] + status))
    assert [f.rule for f in d.findings] == [rule]
    if rule == "parallel-exceeds-gpus":
        assert any("GPUs in the Ray cluster (`ray status`): 1 < 2" in a for a in d.findings[0].fix.arithmetic)
        assert any("placement group" in ln.message for ln in d.findings[0].supporting)


def test_pipeline_parallel_refused_by_the_offline_engine_names_the_entrypoint(remedy_context):
    """Real vllm#7367: V0's LLM class refuses any pipeline-parallel size (0.5.1-0.10.2); the model is not the cause,
    so with no layout in the log the fix is the server, not a tensor-parallel size guessed as 1."""
    ctx = remedy_context("[rank0]: NotImplementedError: Pipeline parallelism is only supported through AsyncLLMEngine "
                         "as performance will be severely degraded otherwise.", rule="pp-unsupported")
    fix = P.fix_pp_unsupported(ctx)
    assert "vllm serve" in fix.summary and fix.edits == []
    ctx = remedy_context("[rank0]: NotImplementedError: Pipeline parallelism is only supported through AsyncLLMEngine "
                         "as performance will be severely degraded otherwise.",
                         command="vllm serve meta-llama/Llama-2-70b-hf -tp 2 -pp 2", rule="pp-unsupported")
    fix = P.fix_pp_unsupported(ctx)
    assert RemoveFlag("--pipeline-parallel-size") in fix.edits
    assert any("vllm serve" in a.summary for a in fix.alternatives)


# gpu_worker.py's check of one node's share (a MetaX guide's log, y904; vllm#28873's under Ray, rp21)
LOCAL_WORLD = "AssertionError: local_world_size (16) must be less than or equal to the number of visible devices (8)."


def test_the_local_world_size_check_is_a_count_on_the_mp_executor(diagnose):
    d = diagnose(LOCAL_WORLD, command="vllm serve m --tensor-parallel-size 16")
    assert [f.rule for f in d.findings][:1] == ["parallel-exceeds-gpus"]


def test_the_local_world_size_check_names_no_count_under_ray(diagnose):
    d = diagnose(LOCAL_WORLD, command="vllm serve m --tensor-parallel-size 16 --distributed-executor-backend ray")
    assert "parallel-exceeds-gpus" not in [f.rule for f in d.findings]
