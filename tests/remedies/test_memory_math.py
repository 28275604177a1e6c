"""Memory arithmetic checked against hand-computed values for real model shapes."""
import pytest

from vllm_doctor.vllm_math import memory as mm


def test_llama3_8b_kv_bytes_per_token():
    # Llama-3-8B: 32 layers, 8 KV heads, head_dim 128, bf16 -> 2*32*8*128*2 = 131072 bytes = 128 KiB
    assert mm.kv_bytes_per_token(32, 8, 128, 2) == 128 * 1024
    assert mm.fmt_bytes(mm.kv_bytes_per_token(32, 8, 128, 2)) == "128 KiB"
    # fp8 KV cache halves it; tp=2 splits the 8 KV heads into 4 per GPU
    assert mm.kv_bytes_per_token(32, 8, 128, mm.dtype_bytes("fp8")) == 64 * 1024
    assert mm.kv_bytes_per_token(32, 8, 128, 2, tp=2) == 64 * 1024


def test_gqa_tp_larger_than_kv_heads_replicates():
    # Llama-3-70B: 80 layers, 8 KV heads. tp=16 > 8 -> still one KV head per GPU, not half a head.
    per_tp8 = mm.kv_bytes_per_token(80, 8, 128, 2, tp=8)
    per_tp16 = mm.kv_bytes_per_token(80, 8, 128, 2, tp=16)
    assert per_tp8 == 2 * 80 * 1 * 128 * 2 == 40960
    assert per_tp16 == per_tp8
    # pipeline parallel: the largest stage holds ceil(80/3) = 27 layers
    assert mm.kv_bytes_per_token(80, 8, 128, 2, tp=8, pp=3) == 2 * 27 * 1 * 128 * 2


def test_mla_latent_not_split_by_tp():
    # DeepSeek-V3: 61 layers, kv_lora_rank 512 + rope 64 = 576 elements, bf16, no x2, same for every tp
    b1 = mm.kv_bytes_per_token(61, use_mla=True, kv_lora_rank=512, qk_rope_head_dim=64, dtype_bytes=2)
    b8 = mm.kv_bytes_per_token(61, use_mla=True, kv_lora_rank=512, qk_rope_head_dim=64, dtype_bytes=2, tp=8)
    assert b1 == 61 * 576 * 2 == 70272
    assert b8 == b1
    with pytest.raises(ValueError):
        mm.kv_bytes_per_token(61, use_mla=True)


def test_block_rounding_and_budget():
    assert mm.round_down_to_block(19175) == 19168
    assert mm.round_down_to_block(15) == 0
    assert mm.round_down_to_block(32, 16) == 32
    # 2.34 GiB / 128 KiB per token = 19169.28 tokens -> 19168 (a whole block of 16)
    assert mm.max_len_for_budget(2.34 * mm.GIB, 128 * 1024) == 19168
    # Llama-3.1-8B at its 128k default needs 16 GiB: 131072 * 128 KiB
    assert mm.kv_bytes_needed(131072, 128 * 1024) == 16 * mm.GIB
    assert mm.kv_bytes_needed(17, 1000, 16) == 32 * 1000
    assert mm.max_len_for_budget(0, 1000) == 0


def test_utilization_for_need_and_cap():
    # need 8 GiB, have 2.34 GiB, 80 GiB card at 0.90 -> 0.90 + 5.66/80 = 0.97075 -> 0.98
    u, capped = mm.utilization_for_need(0.90, 8.0, 2.34, 80.0)
    assert (u, capped) == (0.98, False)
    # capped by what is free (free 70/80 -> 0.86 after the 0.01 margin)
    cap = mm.max_safe_utilization(70.0, 80.0)
    assert cap == 0.86
    u, capped = mm.utilization_for_need(0.80, 8.0, 2.34, 80.0, cap=cap)
    assert capped and u == 0.86
    assert u <= 70.0 / 80.0
    # the numbers from real logs
    assert mm.max_safe_utilization(19.77, 22.05) == 0.88
    assert mm.max_safe_utilization(22.12, 23.54) <= 22.12 / 23.54
    assert mm.max_safe_utilization(0.49, 79.32) == 0.0


def test_kv_at_new_utilization():
    assert mm.kv_gib_at_utilization(0.9, 2.0, 0.95, 80.0) == pytest.approx(6.0)


@pytest.mark.parametrize("text,expected", [
    ("20.00 MiB", 20 * mm.MIB),
    ("1.5 GiB", int(1.5 * mm.GIB)),
    ("0 bytes", 0),
    ("512 bytes", 512),
    ("896.00 KiB", 896 * 1024),
    ("14.99 GB", int(round(14.99 * mm.GIB))),
    ("2 TiB", 2 * mm.TIB),
    (1234, 1234),
])
def test_parse_size(text, expected):
    assert mm.parse_size(text) == expected


def test_parse_size_rejects_garbage():
    assert mm.parse_size("lots") is None
    assert mm.parse_size("12 parsecs") is None
    assert mm.parse_size(None) is None


def test_dtype_bytes():
    assert mm.dtype_bytes("float") == 4
    assert mm.dtype_bytes("bfloat16") == 2
    assert mm.dtype_bytes("fp8_e4m3") == 1
    assert mm.dtype_bytes("auto") == 2
    assert mm.dtype_bytes(None) == 2
