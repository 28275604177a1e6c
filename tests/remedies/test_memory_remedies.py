"""Memory remedies: proposed numbers agree with the figures in the log; OOM phase classification."""
from types import SimpleNamespace

from vllm_doctor.events.phases import classify_frames
from vllm_doctor.refine import oom_phase
from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.remedies import memory
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.remedies.base import RemedyContext


def ctx(captures, facts=None, matches=None):
    f = Facts()
    for key, value in (facts or {}).items():
        f.set(key, value, "log")
    return RemedyContext(rule=None, captures={k: str(v) for k, v in captures.items()}, matches=matches or [],
                         facts=f, command=None)


def flag(fix, name):
    for e in fix.edits:
        if isinstance(e, SetFlag) and e.flag == name:
            return e.value
    return None


def test_kv_uses_estimate_and_stays_within_it():
    fix = memory.fix_kv_cache(ctx({"max_model_len": 131072, "needed_gib": "16.00", "available_gib": "3.39",
                                   "estimated_max_len": 27730}))
    new = int(flag(fix, "--max-model-len"))
    assert new == 27728 and new % 16 == 0 and new <= 27730
    assert "--max-model-len 27728" in fix.summary
    assert any("27,730" in line for line in fix.arithmetic)


def test_kv_v0_token_capacity_never_exceeded():
    fix = memory.fix_kv_cache(ctx({"max_model_len": 32768, "kv_cache_tokens": 7344}))
    assert int(flag(fix, "--max-model-len")) <= 7344


def test_kv_from_model_bytes_per_token():
    # Qwen3-8B-like: 36 layers x 8 KV heads x 128 x 2 bytes x 2 = 144 KiB/token; 3.12 GiB -> 22,719 tokens
    facts = {"model.num_layers": 36, "model.num_attention_heads": 32, "model.num_kv_heads": 8,
             "model.head_dim": 128, "model.dtype": "bfloat16"}
    fix = memory.fix_kv_cache(ctx({"max_model_len": 40960, "needed_gib": "5.62", "available_gib": "3.12"}, facts))
    assert flag(fix, "--max-model-len") == "22704"
    assert any("144 KiB per token" in line for line in fix.arithmetic)


def test_kv_utilization_capped_by_free_memory():
    # 80 GiB card, user set 0.3; the NVML snapshot says only 40 GiB is free -> never above 0.49
    facts = {"args.gpu_memory_utilization": 0.3,
             "gpu.devices": [{"index": 0, "memory_total_mib": 81920, "memory_free_mib": 40960, "processes": []}]}
    fix = memory.fix_kv_cache(ctx({"max_model_len": 131072, "needed_gib": "40.00", "available_gib": "7.10"}, facts))
    utils = [flag(fix, "--gpu-memory-utilization")] + [
        e.value for a in fix.alternatives for e in a.edits if isinstance(e, SetFlag) and e.flag == "--gpu-memory-utilization"]
    utils = [float(u) for u in utils if u]
    assert utils and max(utils) <= 40960 / 81920


def test_kv_user_lowered_utilization_raises_it():
    facts = {"args.gpu_memory_utilization": 0.3,
             "gpu.devices": [{"index": 0, "memory_total_mib": 81559, "memory_free_mib": 80990, "processes": []}]}
    fix = memory.fix_kv_cache(ctx({"max_model_len": 131072, "needed_gib": "16.00", "available_gib": "7.10",
                                   "estimated_max_len": 58160}, facts))
    u = float(flag(fix, "--gpu-memory-utilization"))
    total = 81559 / 1024
    assert u > 0.3 and u <= 80990 / 81559
    assert 7.10 + (u - 0.3) * total >= 16.0


def test_kv_explicit_cache_size_is_dropped_and_utilization_never_offered():
    # --kv-cache-memory-bytes makes vLLM ignore --gpu-memory-utilization for the KV cache
    facts = {"args.kv_cache_memory_bytes": 1048576, "args.gpu_memory_utilization": 0.3,
             "gpu.devices": [{"index": 0, "memory_total_mib": 81559, "memory_free_mib": 80990, "processes": []}]}
    fix = memory.fix_kv_cache(ctx({"max_model_len": 131072, "needed_gib": "16.00", "available_gib": "0.00",
                                   "estimated_max_len": 0}, facts))
    assert fix.summary.startswith("Drop --kv-cache-memory-bytes")
    offered = [fix.edits] + [alt.edits for alt in fix.alternatives]
    assert not any(isinstance(e, SetFlag) and e.flag == "--gpu-memory-utilization" for edits in offered for e in edits)


def test_kv_no_increase_when_already_at_free():
    facts = {"args.gpu_memory_utilization": 0.9,
             "gpu.devices": [{"index": 0, "memory_total_mib": 24576, "memory_free_mib": 22000, "processes": []}]}
    fix = memory.fix_kv_cache(ctx({"max_model_len": 131072, "needed_gib": "16.00", "available_gib": "3.39",
                                   "estimated_max_len": 27728}, facts))
    assert flag(fix, "--gpu-memory-utilization") is None
    assert not any(isinstance(e, SetFlag) and e.flag == "--gpu-memory-utilization"
                   for a in fix.alternatives for e in a.edits)


def test_gpu_util_never_above_free_over_total():
    fix = memory.fix_gpu_util(ctx({"device": "cuda:0", "free_gib": "19.77", "total_gib": "22.05", "util": "0.92",
                                   "requested_gib": "20.29"}))
    u = float(flag(fix, "--gpu-memory-utilization"))
    assert u == 0.88 and u <= 19.77 / 22.05


def test_gpu_util_names_the_process_holding_the_gpu():
    facts = {"gpu.devices": [{"index": 0, "memory_total_mib": 143771, "memory_free_mib": 7516,
                              "processes": [{"pid": 4242, "name": "python3 train.py", "used_mib": 135680}]}]}
    fix = memory.fix_gpu_util(ctx({"free_gib": "7.34", "total_gib": "139.72", "util": "0.9",
                                   "requested_gib": "125.75"}, facts))
    assert "PID 4242" in fix.summary and "python3 train.py" in fix.summary
    assert flag(fix, "--gpu-memory-utilization") is None   # free the GPU, not a blind 0.04


def test_max_model_len_takes_derived_float():
    fix = memory.fix_max_model_len(ctx({"max_model_len": 100000, "key": "max_position_embeddings",
                                        "derived": "512.0", "model_max_length": "None"}))
    assert flag(fix, "--max-model-len") == "512"
    assert any(isinstance(e, SetEnv) and e.name == "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
               for a in fix.alternatives for e in a.edits)


def test_oom_load_fp32_to_auto_then_tp():
    facts = {"args.dtype": "float", "model.dtype": "float16", "model.weight_bytes": 26 * mm.GIB,
             "model.num_attention_heads": 40, "model.num_kv_heads": 40, "model.vocab_size": 32000,
             "model.intermediate_size": 13824, "gpu.count": 2}
    fix = memory.fix_oom_load(ctx({"total": "39.39 GiB", "gpu": 0, "free": "248.06 MiB",
                                   "tried_to_allocate": "270.00 MiB"}, facts))
    assert flag(fix, "--dtype") == "auto"
    tps = [e.value for a in fix.alternatives for e in a.edits if isinstance(e, SetFlag) and e.flag == "--tensor-parallel-size"]
    assert tps == ["2"]


def test_oom_load_tp_only_valid_sizes():
    # 40 heads, 8 KV heads, 4 GPUs, 61 GiB of weights on 44 GiB cards: tp=3 is invalid, tp=2 fits
    facts = {"model.weight_bytes": 61 * mm.GIB, "model.num_attention_heads": 40, "model.num_kv_heads": 8,
             "model.vocab_size": 152064, "model.intermediate_size": 27648, "gpu.count": 4}
    fix = memory.fix_oom_load(ctx({"total": "44.40 GiB", "gpu": 0, "free": "181.25 MiB"}, facts))
    assert flag(fix, "--tensor-parallel-size") == "2"


def test_oom_runtime_fragmentation_sets_env():
    fix = memory.fix_oom_runtime(ctx({"tried_to_allocate": "1.53 GiB", "free": "1.02 GiB", "total": "79.19 GiB",
                                      "gpu": 0, "reserved_unallocated": "5.62 GiB"}))
    assert SetEnv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True") in fix.edits


def test_oom_runtime_small_reserve_is_not_fragmentation():
    fix = memory.fix_oom_runtime(ctx({"tried_to_allocate": "20.00 MiB", "free": "18.81 MiB", "total": "23.68 GiB",
                                      "gpu": 0, "reserved_unallocated": "24.51 MiB"}))
    assert not any(isinstance(e, SetEnv) for e in fix.edits)


def test_oom_runtime_sampler_halves_max_num_seqs():
    fix = memory.fix_oom_runtime(ctx({"warmup": "sampler", "num_reqs": 1024}))
    assert flag(fix, "--max-num-seqs") == "512"


def test_oom_runtime_other_process_named_from_oom_text():
    fix = memory.fix_oom_runtime(ctx({"tried_to_allocate": "1.22 GiB", "free": "602.75 MiB", "total": "79.15 GiB",
                                      "gpu": 2, "other_pid": 5555, "other_used": "9.80 GiB"}))
    assert "PID 5555" in fix.summary and "9.80 GiB" in fix.summary


def _rctx(funcs=(), milestones=(), pattern="torch-oom"):
    frames = [SimpleNamespace(func=f, file=f"/x/vllm/{f}.py") for f in funcs]
    return SimpleNamespace(match=SimpleNamespace(pattern=SimpleNamespace(name=pattern), captures={}),
                           traceback=SimpleNamespace(frames=frames) if frames else None,
                           facts=Facts(), milestones=frozenset(milestones))


def test_phase_from_frames():
    assert oom_phase.classify(_rctx(["run_engine_core", "load_model", "get_model", "load_weights", "weight_loader"])) == "cuda-oom-load"
    assert oom_phase.classify(_rctx(["determine_num_available_blocks", "profile_run", "forward"])) is None
    assert oom_phase.classify(_rctx(["compile_or_warm_up_model", "capture_model", "_dummy_run"])) is None
    # a load frame outside the innermost runtime frame does not make it a load OOM
    assert classify_frames(["load_model", "profile_run"]) == "profile"
    assert classify_frames(["x", "y"], ["/a/vllm/model_executor/model_loader/loader.py", "/a/z.py"]) == "load"
    assert classify_frames(["determine_available_memory", "profile_cudagraph_memory", "forward"]) == "graph"
    # set-up before anything of vLLM's is allocated: the worker's init_device, NCCL communicator buffers
    assert classify_frames(["run_engine_core", "init_device", "__init__"],
                                  ["core.py", "gpu_worker.py", "/a/vllm/utils/mem.py"]) == "init"
    assert classify_frames(["init_worker_distributed_environment", "__init__", "all_reduce"],
                                  ["gpu_worker.py", "/a/vllm/distributed/device_communicators/pynccl.py",
                                   "pynccl.py"]) == "init"
    assert classify_frames(["profile_run", "__init__"], ["r.py", "/a/vllm/model_executor/layers/x.py"]) \
        == "profile"


def test_oom_before_vllm_allocates_anything_frees_the_gpu_without_flag_edits():
    tb = SimpleNamespace(frames=[SimpleNamespace(func=f, file="") for f in ("run_engine_core", "init_device")])
    m = SimpleNamespace(pattern=SimpleNamespace(name="cuda-error-oom"), captures={}, traceback=tb)
    fix = memory.fix_oom_runtime(ctx({}, {"args.gpu_memory_utilization": 0.9}, matches=[m]))
    assert fix.edits == [] and fix.summary.startswith("Free the GPU")
    assert any("does not help" in n for n in fix.notes)


def test_phase_from_milestones():
    assert oom_phase.classify(_rctx(milestones={"weights_loading"})) == "cuda-oom-load"
    assert oom_phase.classify(_rctx(milestones={"weights_loading", "weights_loaded"})) is None
    assert oom_phase.classify(_rctx(milestones={"weights_loading"}, pattern="sampler-warmup")) is None
    ctx_ = _rctx(milestones={"weights_loading", "weights_loaded", "kv_cache_sized", "graph_capture"})
    oom_phase.classify(ctx_)
    assert ctx_.facts.get(memory.PHASE_FACT) == "graph"
