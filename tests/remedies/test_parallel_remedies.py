"""The parallel remedies and the `A is not divisible by B` refine hook."""
from types import SimpleNamespace as NS

from vllm_doctor.refine import divide
from vllm_doctor.command.edits import RemoveFlag, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.remedies import parallel as P
from vllm_doctor.remedies.base import RemedyContext

TP, PP = "--tensor-parallel-size", "--pipeline-parallel-size"


def ctx(captures=None, facts=None, source="config.json", matches=None):
    f = Facts()
    for key, value in (facts or {}).items():
        f.set(key, value, source)
    return RemedyContext(rule=None, captures=captures or {}, matches=matches or [], facts=f, command=None)


VICUNA = {"model.num_attention_heads": 40, "model.num_kv_heads": 40, "model.vocab_size": 32000,
          "model.intermediate_size": 13824}


def test_heads_from_captures_only():
    fix = P.fix_tensor_parallel(ctx({"heads": "40", "tp": "3"}))
    assert fix.edits[0] == SetFlag(TP, "2")
    assert "--tensor-parallel-size 2" in fix.summary and "40" in fix.summary
    assert "attention heads: 40 % 3 = 1 -> --tensor-parallel-size 3 is rejected" in fix.arithmetic
    assert "divisors of 40 attention heads: 1, 2, 4, 5, 8, 10, 20, 40" in fix.arithmetic
    assert any("GPU count unknown" in n for n in fix.notes)
    alt = [(a.summary, a.edits) for a in fix.alternatives]
    assert ("Use --tensor-parallel-size 1 --pipeline-parallel-size 3",
            [SetFlag(TP, "1"), SetFlag(PP, "3")]) in alt


def test_heads_only_known_proposes_powers_of_two():
    # 6 GPUs, 40 heads: 5 divides the heads but fails Llama-2-13B's MLP; without a config, stay at 4
    fix = P.fix_tensor_parallel(ctx({"heads": "40", "tp": "6"}, {"gpu.count": 6}, source="nvml"))
    assert fix.edits[0] == SetFlag(TP, "4")


def test_heads_with_full_facts_and_memory():
    facts = dict(VICUNA, **{"gpu.count": 3, "model.weight_bytes": 26 << 30,
                            "gpu.devices": [{"memory_total_mib": 24 << 10}] * 3})
    fix = P.fix_tensor_parallel(ctx({"heads": "40", "tp": "3"}, facts))
    assert fix.edits == [SetFlag(TP, "2"), SetFlag(PP, "1")]
    assert "GPUs available: 3" in fix.arithmetic
    assert any(line.startswith("tp=3 fails: attention heads: 40 % 3 = 1; vocabulary (32000): 32000 % 3 = 2")
               for line in fix.arithmetic)
    assert "valid --tensor-parallel-size values up to 3: 1, 2" in fix.arithmetic
    assert any("weights ~13.0 GiB per GPU of 24 GiB" in line for line in fix.arithmetic)
    assert fix.facts_used["attention_heads"] == "40 (log)"
    assert fix.facts_used["vocab_size"].startswith("32000 (model.vocab_size")


def test_heads_llama3_70b_eight_gpus():
    facts = {"model.num_attention_heads": 64, "model.num_kv_heads": 8, "model.vocab_size": 128256,
             "model.intermediate_size": 28672, "gpu.count": 8, "args.tensor_parallel_size": 6}
    fix = P.fix_tensor_parallel(ctx({}, facts))
    # pp=1 is said explicitly because the alternatives (-tp 4 -pp 2, ...) use pipeline stages
    assert fix.edits == [SetFlag(TP, "8"), SetFlag(PP, "1")]
    assert fix.alternatives[0].edits == [SetFlag(TP, "4"), SetFlag(PP, "2")]
    assert "64 attention heads divide by 8" in fix.summary


def test_kv_bare_assert_with_config():
    facts = {"model.num_attention_heads": 40, "model.num_kv_heads": 8, "model.vocab_size": 32000,
             "model.intermediate_size": 14080, "args.tensor_parallel_size": 5, "gpu.count": 5}
    fix = P.fix_kv_heads(ctx({}, facts))
    assert fix.edits[0] == SetFlag(TP, "4")
    assert fix.arithmetic[0] == "KV heads: 8 % 5 = 3 (K >= tp: KV heads are split, so tp must divide 8)"
    assert "8 KV heads split 2 per GPU" in fix.summary


def test_kv_replication_branch_from_divide_message():
    # "12 is not divisible by 8": tp=12 known, so K=8 (tp % K branch)
    fix = P.fix_kv_heads(ctx({"numerator": "12", "denominator": "8"},
                             {"args.tensor_parallel_size": 12, "model.num_attention_heads": 48}))
    assert fix.arithmetic[0].startswith("KV heads: 12 % 8 = 4 (K < tp")
    assert fix.edits[0] == SetFlag(TP, "8")


def test_kv_dcp_message():
    m = NS(line=NS(message="Value error, Decode context parallelism for GQA/MQA requires "
                           "`--tensor-parallel-size` (4) to be greater than ..."), captures={})
    fix = P.fix_kv_heads(ctx({"tp": "4", "kv_heads": "8"}, {"gpu.count": 16, "model.num_attention_heads": 64},
                             matches=[m]))
    assert fix.edits == [SetFlag("--decode-context-parallel-size", "1")]
    assert fix.alternatives[0].edits == [SetFlag(TP, "16")]


def test_shape_vocab_with_and_without_config():
    bare = P.fix_shape(ctx({"numerator": "152064", "denominator": "5"}))
    assert bare.edits[0] == SetFlag(TP, "4")
    assert "a sharded dimension 152064: 152064 % 5 = 4 -> tp=5 cannot shard it" in bare.arithmetic
    full = P.fix_shape(ctx({"numerator": "152064", "denominator": "5"},
                           {"model.num_attention_heads": 40, "model.num_kv_heads": 8,
                            "model.vocab_size": 152064, "model.intermediate_size": 27648}))
    assert "vocabulary 152064: 152064 % 5 = 4 -> tp=5 cannot shard it" in full.arithmetic
    assert full.edits[0] == SetFlag(TP, "4")


def test_shape_marlin_group_straddle_needs_pipeline():
    fix = P.fix_shape(ctx({"size_per_partition": "3696", "group": "128"},
                          {"args.tensor_parallel_size": 8, "gpu.count": 8}))
    assert fix.edits == [SetFlag(TP, "1"), SetFlag(PP, "8")]
    assert fix.arithmetic[0] == ("input size per partition 3696 % group/tile 128 = 112 "
                                 "(full input 29568 = 3696 x tp 8)")


def test_pp_unsupported_drops_pp():
    fix = P.fix_pp_unsupported(ctx({}, {"args.tensor_parallel_size": 2, "args.pipeline_parallel_size": 2,
                                        "model.num_attention_heads": 32, "model.num_kv_heads": 8}))
    assert fix.edits == [SetFlag(TP, "4"), RemoveFlag(PP)]
    assert "drop --pipeline-parallel-size" in fix.summary
    assert "requested world size: tp 2 x pp 2 = 4" in fix.arithmetic


def test_exceeds_gpus_world_size_message():
    fix = P.fix_exceeds_gpus(ctx({"world_size": "8", "gpus": "4"}, {"args.tensor_parallel_size": 8}))
    assert fix.edits[0] == SetFlag(TP, "4")
    assert "world size = tp 8 x pp 1 = 8" in fix.arithmetic and "GPUs available: 4 < 8" in fix.arithmetic
    assert any(a.edits == [SetFlag("--distributed-executor-backend", "ray")] for a in fix.alternatives)
    assert all(p.tp * p.pp <= 4 for p in P._plans_from_sizes(P.gather(ctx({})), [1, 2, 4], 4))


def test_exceeds_gpus_count_from_a_later_warning_match():
    warn = NS(captures={"tp": "4", "gpus": "2"}, line=NS(message="Tensor parallel size (4) exceeds ..."))
    fix = P.fix_exceeds_gpus(ctx({"world_size": "4"}, matches=[warn]))
    assert fix.edits[0] == SetFlag(TP, "2")


# ----------------------------------------------------------------- refine hook

def rctx(a, b, facts=None, frames=None):
    f = Facts()
    for key, value in (facts or {}).items():
        f.set(key, value, "log")
    tb = NS(frames=[NS(file=fi, lineno=1, func="__init__", code=co) for fi, co in frames]) if frames else None
    return NS(match=NS(rule_id="tp-shape-indivisible", captures={"numerator": str(a), "denominator": str(b)}),
              traceback=tb, facts=f, milestones=set())


def test_classify_by_numbers():
    assert divide.classify(rctx(8, 5, {"args.tensor_parallel_size": 5})) == "tp-kv-heads-indivisible"
    assert divide.classify(rctx(6, 4, {"args.tensor_parallel_size": 6})) == "tp-kv-heads-indivisible"
    assert divide.classify(rctx(152064, 5, {"args.tensor_parallel_size": 5})) == "tp-shape-indivisible"
    assert divide.classify(rctx(8, 5)) == "tp-kv-heads-indivisible"          # no config at all
    assert divide.classify(rctx(13824, 5)) == "tp-shape-indivisible"
    assert divide.classify(rctx(8, 5, {"model.num_kv_heads": 8, "args.tensor_parallel_size": 5})) \
        == "tp-kv-heads-indivisible"
    assert divide.classify(rctx(25, 4, {"model.vision_num_heads": 25})) == "tp-heads-indivisible"


def test_classify_by_traceback_frames():
    divide_frames = [("vllm/distributed/utils.py", "ensure_divisibility(numerator, denominator)"),
              ("vllm/distributed/utils.py", 'assert numerator % denominator == 0, "{} is not divisible by {}".format(')]
    vit = [("vllm/model_executor/models/intern_vit.py", "self.num_heads_per_partition = divide(self.num_heads, self.tp_size)")]
    assert divide.classify(rctx(25, 4, frames=vit + divide_frames)) == "tp-heads-indivisible"
    qkv = [("vllm/model_executor/layers/linear.py", "self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)")]
    assert divide.classify(rctx(8, 5, frames=qkv + divide_frames)) == "tp-kv-heads-indivisible"
    vocab = [("vllm/model_executor/layers/vocab_parallel_embedding.py",
              "per_partition_vocab_size = divide(global_vocab_size, world_size)")]
    assert divide.classify(rctx(64, 3, frames=vocab + divide_frames)) == "tp-shape-indivisible"
