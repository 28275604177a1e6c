"""vLLM's tensor/pipeline-parallel arithmetic (docs/reference/vllm-messages.md §4) on real model shapes."""
from vllm_doctor.vllm_math.parallel import (padded_vocab, plan, rank_plans, valid_tp_sizes,
                                                why_invalid)

# (heads, kv_heads, vocab, intermediate) from the models' config.json
LLAMA2_13B = dict(heads=40, kv_heads=40, vocab=32000, intermediate=13824)
LLAMA3_70B = dict(heads=64, kv_heads=8, vocab=128256, intermediate=28672)
QWEN25_7B = dict(heads=28, kv_heads=4, vocab=152064, intermediate=18944)
QWEN25_32B = dict(heads=40, kv_heads=8, vocab=152064, intermediate=27648)


def test_padded_vocab_rounds_up_to_64():
    assert padded_vocab(32000) == 32000
    assert padded_vocab(151936) == 151936
    assert padded_vocab(32001) == 32064


def test_llama2_13b_vicuna_valid_sizes_capped_by_gpus():
    assert valid_tp_sizes(**LLAMA2_13B, max_tp=8) == [1, 2, 4, 8]
    assert valid_tp_sizes(**LLAMA2_13B, max_tp=3) == [1, 2]
    # 5 divides the 40 heads, but not the 13824-wide MLP
    assert why_invalid(5, **LLAMA2_13B) == ["intermediate_size: 13824 % 5 = 4"]
    assert "attention heads: 40 % 3 = 1" in why_invalid(3, **LLAMA2_13B)


def test_llama3_70b_tp16_valid_by_kv_replication():
    sizes = valid_tp_sizes(**LLAMA3_70B)
    assert 16 in sizes and sizes == [1, 2, 4, 8, 16, 32, 64]
    for bad in (3, 5, 6):
        assert bad not in sizes
        assert why_invalid(bad, **LLAMA3_70B)[0].startswith(f"attention heads: 64 % {bad} = ")


def test_qwen25_7b_tp7_fails_first_on_vocab():
    assert valid_tp_sizes(**QWEN25_7B) == [1, 2, 4]
    why = why_invalid(7, **QWEN25_7B)
    assert why[0] == "vocabulary (152064): 152064 % 7 = 3"     # heads pass: 28 % 7 == 0
    assert any("KV heads: 7 % 4 = 3" in w for w in why)


def test_qwen25_32b_tp5_and_tp10_fail_on_vocab():
    for t in (5, 10):
        assert 40 % t == 0
        assert why_invalid(t, **QWEN25_32B)[0] == f"vocabulary (152064): 152064 % {t} = {152064 % t}"
    assert valid_tp_sizes(**QWEN25_32B) == [1, 2, 4, 8]


def test_kv_rule_split_or_replicate():
    # H=40, K=8: t=5 passes the heads but not the KV split
    assert why_invalid(5, 40, kv_heads=8, vocab=32000) == [
        "KV heads: 8 % 5 = 3 (KV heads are split across ranks when K >= tp)"]
    # H=48, K=8: t=12 > K must be a multiple of 8
    assert why_invalid(12, 48, kv_heads=8) == [
        "KV heads: 12 % 8 = 4 (tp must be a multiple of K=8 to replicate KV heads when K < tp)"]
    assert valid_tp_sizes(48, kv_heads=8) == [1, 2, 4, 8, 16, 24, 48]


def test_mqa_single_kv_head_any_divisor_of_heads():
    assert valid_tp_sizes(48, kv_heads=1) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]


def test_deepseek_v3_mla_only_the_query_heads_matter():
    # MLA: 128 query heads; KV is a shared latent (not a head count to split)
    sizes = valid_tp_sizes(128, vocab=129280, intermediate=18432, moe_intermediate=2048, max_tp=16)
    assert sizes == [1, 2, 4, 8, 16]


def test_gptq_group_may_not_straddle_ranks():
    # Qwen2-72B GPTQ: intermediate 29568 = 231 x 128; 29568/8 = 3696 is not a multiple of 128
    why = why_invalid(8, 64, kv_heads=8, vocab=152064, intermediate=29568, quant_group=128, head_dim=128)
    assert why == ["quantization groups: intermediate_size/tp = 29568/8 = 3696; 3696 % 128 = 112 "
                   "(group size 128 would straddle ranks)"]
    assert valid_tp_sizes(64, 8, 152064, 29568, quant_group=128, head_dim=128) == [1]
    # channel-wise (-1) has no constraint
    assert 8 in valid_tp_sizes(64, 8, 152064, 29568, quant_group=-1)


def test_vision_tower_heads():
    # InternVL2-26B: LLM 48 heads / 8 KV heads, InternViT-6B 25 heads
    assert valid_tp_sizes(48, kv_heads=8, vocab=92553, vision_heads=25, max_tp=8) == [1]
    assert why_invalid(4, 48, kv_heads=8, vision_heads=25) == ["vision-tower heads: 25 % 4 = 1"]


def test_plan_three_gpus_forty_heads():
    ranked = rank_plans(3, **LLAMA2_13B)
    assert [p.as_tuple() for p in ranked] == [(2, 1), (1, 3), (1, 1)]
    assert ranked[0].costs == ["leaves 1 of 3 GPUs idle"]
    assert "pipeline bubbles" in ranked[1].costs[0]


def test_plan_prefers_using_the_gpus_when_pure_tp_would_idle_half():
    # 52 heads (WizardLM-33B style) on 8 GPUs: tp=4 alone idles 4 GPUs
    assert plan(8, 52, 52, 32000, 17920)[:2] == [(4, 2), (2, 4)]


def test_plan_memory_decides():
    # 26 GiB of weights on 3 x 16 GiB: tp=2 leaves no room for KV cache, -tp 1 -pp 3 fits
    ranked = rank_plans(3, **LLAMA2_13B, weight_bytes=26 << 30, gpu_mem_bytes=16 << 30)
    assert ranked[0].as_tuple() == (1, 3) and ranked[0].fits
    assert ranked[-1].fits is False


def test_plan_costs_kv_cache_stops_shrinking_beyond_kv_heads():
    ranked = rank_plans(16, **LLAMA3_70B)
    assert ranked[0].as_tuple() == (16, 1)
    assert any("KV cache per GPU stops shrinking" in c for c in ranked[0].costs)


def test_plan_without_pp_support_and_exclude():
    assert all(pp == 1 for _, pp in plan(4, 40, pp_supported=False))
    assert (4, 1) not in plan(4, 32, exclude=(4, 1))
