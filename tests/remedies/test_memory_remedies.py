import pytest
"""Memory remedies on real log lines run through the engine (remedy_context / diagnose, tests/remedies/conftest.py):
the numbers proposed agree with the figures in the log; the OOM phase from tracebacks and milestones."""
from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.events.phases import PHASE_FACT, classify_frames
from vllm_doctor.remedies import memory
from vllm_doctor.vllm_math import memory as mm

TAIL = " Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."


def kv_line(mml, needed, avail, estimate=None):
    """vLLM V1's kv-cache-insufficient message (kv_cache_utils.check_enough_kv_cache_memory)."""
    text = (f"ValueError: To serve at least one request with the model's max seq len ({mml}), ({needed} GiB KV cache "
            f"is needed, which is larger than the available KV cache memory ({avail} GiB).")
    if estimate is not None:
        text += f" Based on the available memory, the estimated maximum model length is {estimate}."
    return text + TAIL


def torch_oom(tried, gpu, total, free, extra=""):
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU {gpu} has a total capacity "
            f"of {total} of which {free} is free. {extra}")


def load_oom(tried, total, free):
    return ("ERROR 11-03 09:12:44 [gpu_model_runner.py:3512] Failed to load model - not enough GPU memory. Try lowering "
            "--gpu-memory-utilization to free memory for weights, increasing --tensor-parallel-size, or using "
            f"--quantization. (original error: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity "
            f"of {total} of which {free} is free. Including non-PyTorch memory, this process has 39.1 GiB memory in use.)")


def gpu(total_mib, free_mib, procs=()):
    return [{"index": 0, "memory_total_mib": total_mib, "memory_free_mib": free_mib, "processes": list(procs)}]


def flag(fix, name):
    return next((e.value for e in fix.edits if isinstance(e, SetFlag) and e.flag == name), None)


def offered(fix, name):
    return [e.value for edits in [fix.edits] + [a.edits for a in fix.alternatives] for e in edits
            if isinstance(e, SetFlag) and e.flag == name]


def test_kv_uses_estimate_and_stays_within_it(remedy_context):
    fix = memory.fix_kv_cache(remedy_context(kv_line(131072, "16.00", "3.39", 27730)))
    new = int(flag(fix, "--max-model-len"))
    # headroom below vLLM's estimate: at least 5 % (and a block), not a block more than that, whole blocks
    assert new % 16 == 0 and 27730 * 0.95 - 16 <= new <= 27730 * 0.95
    assert f"--max-model-len {new}" in fix.summary
    assert any("27,730" in line for line in fix.arithmetic)
    assert any(f"{27728 - new} tokens of headroom" in line for line in fix.arithmetic)


def test_kv_v0_token_capacity_never_exceeded(remedy_context):
    ctx = remedy_context("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that "
                         "can be stored in KV cache (7344)." + TAIL)
    assert int(flag(memory.fix_kv_cache(ctx), "--max-model-len")) <= 7344


def test_kv_from_model_bytes_per_token(remedy_context):
    # Qwen3-8B-like: 36 layers x 8 KV heads x 128 x 2 bytes x 2 = 144 KiB/token; 3.12 GiB -> 22,719 tokens
    facts = {"model.num_layers": 36, "model.num_attention_heads": 32, "model.num_kv_heads": 8,
             "model.head_dim": 128, "model.dtype": "bfloat16"}
    fix = memory.fix_kv_cache(remedy_context(kv_line(40960, "5.62", "3.12"), facts=facts))
    new = int(flag(fix, "--max-model-len"))
    assert new % 16 == 0 and 22704 * 0.95 - 16 <= new <= 22704 * 0.95   # 22,719 tokens fit: 22,704 in blocks
    assert any("144 KiB per token" in line for line in fix.arithmetic)
    assert fix.facts_used["kv_bytes_per_token"] == 144 * 1024


def test_kv_utilization_capped_by_free_memory(remedy_context):
    # 80 GiB card, user set 0.3; the NVML snapshot says only 40 GiB is free -> never above 0.49
    facts = {"args.gpu_memory_utilization": 0.3, "gpu.devices": gpu(81920, 40960)}
    fix = memory.fix_kv_cache(remedy_context(kv_line(131072, "40.00", "7.10"), facts=facts))
    utils = [float(u) for u in offered(fix, "--gpu-memory-utilization")]
    assert utils and max(utils) <= 40960 / 81920


def test_kv_user_lowered_utilization_raises_it(remedy_context):
    facts = {"args.gpu_memory_utilization": 0.3, "gpu.devices": gpu(81559, 80990)}
    fix = memory.fix_kv_cache(remedy_context(kv_line(131072, "16.00", "7.10", 58160), facts=facts))
    u = float(flag(fix, "--gpu-memory-utilization"))
    assert 0.3 < u <= 80990 / 81559
    assert 7.10 + (u - 0.3) * 81559 / 1024 >= 16.0


def test_kv_explicit_cache_size_is_dropped_and_utilization_never_offered(remedy_context):
    # --kv-cache-memory-bytes makes vLLM ignore --gpu-memory-utilization for the KV cache
    ctx = remedy_context(kv_line(131072, "16.00", "0.00", 0), facts={"gpu.devices": gpu(81559, 80990)},
                         command="vllm serve m --kv-cache-memory-bytes 1048576 --gpu-memory-utilization 0.3")
    fix = memory.fix_kv_cache(ctx)
    assert fix.summary.startswith("Drop --kv-cache-memory-bytes")
    assert not offered(fix, "--gpu-memory-utilization")


def test_kv_no_increase_when_already_at_free(remedy_context):
    facts = {"args.gpu_memory_utilization": 0.9, "gpu.devices": gpu(24576, 22000)}
    fix = memory.fix_kv_cache(remedy_context(kv_line(131072, "16.00", "3.39", 27728), facts=facts))
    assert not offered(fix, "--gpu-memory-utilization")


def test_kv_length_from_the_command_as_vllm_reads_it(remedy_context):
    # --max-model-len 32k is 32,000 tokens (vLLM's human_readable_int); no figure in the message
    ctx = remedy_context("ValueError: No available memory for the cache blocks. Try increasing "
                         "`gpu_memory_utilization` when initializing the engine.", command="vllm serve m --max-model-len 32k")
    assert memory.fix_kv_cache(ctx).facts_used["max_model_len"] == 32000


def test_gpu_util_never_above_free_over_total(remedy_context):
    ctx = remedy_context("(Worker_TP0 pid=300) ERROR 02-24 20:21:58 [multiproc_executor.py:772] ValueError: Free memory "
                         "on device cuda:0 (19.77/22.05 GiB) on startup is less than desired GPU memory utilization "
                         "(0.92, 20.29 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    u = float(flag(memory.fix_gpu_util(ctx), "--gpu-memory-utilization"))
    assert u == 0.88 and u <= 19.77 / 22.05


def test_gpu_util_names_the_process_holding_the_gpu(remedy_context):
    facts = {"gpu.devices": gpu(143771, 7516, [{"pid": 4242, "name": "python3 train.py", "used_mib": 135680}])}
    ctx = remedy_context("ValueError: Free memory on device (7.34/139.72 GiB) on startup is less than desired GPU "
                         "memory utilization (0.9, 125.75 GiB). Decrease GPU memory utilization or reduce GPU memory "
                         "used by other processes.", facts=facts)
    fix = memory.fix_gpu_util(ctx)
    assert "PID 4242" in fix.summary and "python3 train.py" in fix.summary
    assert flag(fix, "--gpu-memory-utilization") is None   # free the GPU, not a blind 0.04


def test_max_model_len_takes_derived_float(remedy_context):
    ctx = remedy_context("  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len "
                         "(max_position_embeddings=512.0 or model_max_length=None in model's config.json). To allow "
                         "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.")
    fix = memory.fix_max_model_len(ctx)
    assert flag(fix, "--max-model-len") == "512"
    assert any(isinstance(e, SetEnv) and e.name == "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
               for a in fix.alternatives for e in a.edits)


def test_oom_load_fp32_to_auto_then_tp(remedy_context):
    facts = {"model.dtype": "float16", "model.weight_bytes": 26 * mm.GIB, "model.num_attention_heads": 40,
             "model.num_kv_heads": 40, "model.vocab_size": 32000, "model.intermediate_size": 13824, "gpu.count": 2}
    ctx = remedy_context(load_oom("270.00 MiB", "39.39 GiB", "248.06 MiB"), facts=facts,
                         command="vllm serve lmsys/vicuna-13b-v1.5 --dtype float", rule="cuda-oom-load")
    fix = memory.fix_oom_load(ctx)
    assert flag(fix, "--dtype") == "auto"
    assert [e.value for a in fix.alternatives for e in a.edits
            if isinstance(e, SetFlag) and e.flag == "--tensor-parallel-size"] == ["2"]


def test_oom_load_tp_only_valid_sizes(remedy_context):
    # 40 heads, 8 KV heads, 4 GPUs, 61 GiB of weights on 44 GiB cards: tp=3 is invalid, tp=2 fits
    facts = {"model.weight_bytes": 61 * mm.GIB, "model.num_attention_heads": 40, "model.num_kv_heads": 8,
             "model.vocab_size": 152064, "model.intermediate_size": 27648, "gpu.count": 4}
    ctx = remedy_context(load_oom("20.00 MiB", "44.40 GiB", "181.25 MiB"), facts=facts, rule="cuda-oom-load")
    assert flag(memory.fix_oom_load(ctx), "--tensor-parallel-size") == "2"


def test_oom_load_quantized_model_is_sized_not_unknown(remedy_context):
    # an AWQ checkpoint of unknown size: its weights are estimated at 0.55 bytes/parameter, not left out
    facts = {"model.num_attention_heads": 64, "model.num_kv_heads": 8, "model.num_layers": 64, "model.hidden_size": 5120,
             "model.head_dim": 128, "model.intermediate_size": 25600, "model.vocab_size": 151936,
             "model.quant_method": "awq", "model.quant_group_size": 128, "model.quant_bits": 4, "gpu.count": 2}
    ctx = remedy_context(load_oom("20.00 MiB", "15.60 GiB", "181.25 MiB"), facts=facts, rule="cuda-oom-load")
    fix = memory.fix_oom_load(ctx)
    assert 17 < fix.facts_used["weights_total_gib"] < 20
    assert flag(fix, "--tensor-parallel-size") == "2"


def test_oom_runtime_fragmentation_sets_env(remedy_context):
    ctx = remedy_context(torch_oom("1.53 GiB", 0, "79.19 GiB", "1.02 GiB", "Of the allocated memory 71.30 GiB is "
                                   "allocated by PyTorch, and 5.62 GiB is reserved by PyTorch but unallocated."))
    assert SetEnv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True") in memory.fix_oom_runtime(ctx).edits


def test_oom_runtime_small_reserve_is_not_fragmentation(remedy_context):
    ctx = remedy_context(torch_oom("20.00 MiB", 0, "23.68 GiB", "18.81 MiB", "Of the allocated memory 22.10 GiB is "
                                   "allocated by PyTorch, and 24.51 MiB is reserved by PyTorch but unallocated."))
    assert not any(isinstance(e, SetEnv) for e in memory.fix_oom_runtime(ctx).edits)


def test_oom_runtime_sampler_halves_max_num_seqs(remedy_context):
    ctx = remedy_context("(EngineCore_DP0 pid=88) RuntimeError: CUDA out of memory occurred when warming up sampler "
                         "with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` "
                         "when initializing the engine.")
    assert flag(memory.fix_oom_runtime(ctx), "--max-num-seqs") == "512"


def test_oom_runtime_other_process_named_from_oom_text(remedy_context):
    ctx = remedy_context(torch_oom("1.22 GiB", 2, "79.15 GiB", "602.75 MiB", "Process 5555 has 9.80 GiB memory in use."))
    fix = memory.fix_oom_runtime(ctx)
    assert "PID 5555" in fix.summary and "9.80 GiB" in fix.summary


PREEMPTIVE = ("(EngineCore_DP0 pid=412) [W1203 10:22:41.118Z CUDACachingAllocator.cpp:1290] Preemptively rejecting "
              "allocation: requested 4.00 GiB but total_allocated_memory (71.20 GiB) + requested size would exceed "
              "memory limit ({pct}% of 79.19 GiB). Set throw_on_cudamalloc_oom:false to disable.")


@pytest.mark.parametrize("pct, util, expected", [(90, "0.95", "0.87"), (85, "0.80", "0.77"), (98, "0.92", "0.89")])
def test_oom_runtime_under_pytorchs_own_cap_keeps_vllm_below_it(remedy_context, pct, util, expected):
    """torch 2.12's per_process_memory_fraction + throw_on_cudamalloc_oom refuses a request past the user's own
    cap, however much is free: the fix keeps --gpu-memory-utilization 0.03 under the cap (or 0.03 lower when
    it already is), and says which cap it was."""
    ctx = remedy_context(PREEMPTIVE.format(pct=pct), command=f"vllm serve m --gpu-memory-utilization {util}")
    fix = memory.fix_oom_runtime(ctx)
    assert flag(fix, "--gpu-memory-utilization") == expected
    assert f"{pct}%" in fix.summary and "per_process_memory_fraction" in fix.arithmetic[0]


def test_oom_runtime_an_ordinary_oom_is_not_blamed_on_a_cap(remedy_context):
    ctx = remedy_context(torch_oom("1.22 GiB", 0, "79.15 GiB", "602.75 MiB"))
    assert "per_process_memory_fraction" not in memory.fix_oom_runtime(ctx).summary


# ----------------------------------------------------------------- the OOM phase

def traceback(*frames, error="torch.OutOfMemoryError: CUDA out of memory."):
    """A worker traceback: (file under vllm/, function) per frame, innermost last."""
    lines = ["Traceback (most recent call last):"]
    for i, (path, func) in enumerate(frames, 1):
        lines += [f'  File "/usr/local/lib/python3.12/dist-packages/vllm/{path}", line {100 + i}, in {func}',
                  "    pass"]
    return lines + [error]


CORE = ("v1/engine/core.py", "run_engine_core")


def test_phase_from_frames(diagnose):
    load = traceback(CORE, ("worker/model_runner.py", "load_model"), ("model_executor/model_loader/loader.py", "get_model"),
                     ("model_executor/models/llama.py", "load_weights"), ("model_executor/layers/linear.py", "weight_loader"))
    assert diagnose(load).findings[0].rule == "cuda-oom-load"
    profile = traceback(CORE, ("worker/worker.py", "determine_num_available_blocks"),
                        ("worker/model_runner.py", "profile_run"), ("model_executor/models/llama.py", "forward"))
    assert diagnose(profile).findings[0].rule == "cuda-oom-runtime"
    graph = traceback(CORE, ("worker/worker.py", "compile_or_warm_up_model"), ("worker/model_runner.py", "capture_model"),
                      ("worker/model_runner.py", "_dummy_run"))
    assert diagnose(graph).findings[0].rule == "cuda-oom-runtime"
    # the classification itself: a load frame outside the innermost runtime frame does not make it a load OOM
    assert classify_frames(["load_model", "profile_run"]) == "profile"
    assert classify_frames(["x", "y"], ["/a/vllm/model_executor/model_loader/loader.py", "/a/z.py"]) == "load"
    assert classify_frames(["determine_available_memory", "profile_cudagraph_memory", "forward"]) == "graph"
    # set-up before anything of vLLM's is allocated: the worker's init_device, NCCL communicator buffers
    assert classify_frames(["run_engine_core", "init_device", "__init__"],
                           ["core.py", "gpu_worker.py", "/a/vllm/utils/mem.py"]) == "init"
    assert classify_frames(["init_worker_distributed_environment", "__init__", "all_reduce"],
                           ["gpu_worker.py", "/a/vllm/distributed/device_communicators/pynccl.py", "pynccl.py"]) == "init"
    assert classify_frames(["profile_run", "__init__"], ["r.py", "/a/vllm/model_executor/layers/x.py"]) == "profile"
    # x1/x105 (xinference#1361): a paste that kept only the layer's __init__ and torch.empty: the model being built
    assert classify_frames(["__init__", "__torch_function__"],
                           ["/env/vllm/model_executor/layers/vocab_parallel_embedding.py", "/env/torch/utils/_device.py"]) == "load"


def test_oom_before_vllm_allocates_anything_frees_the_gpu_without_flag_edits(remedy_context):
    lines = traceback(CORE, ("v1/worker/gpu_worker.py", "init_device"), error="RuntimeError: CUDA error: out of memory")
    ctx = remedy_context(lines, facts={"args.gpu_memory_utilization": 0.9}, rule="cuda-oom-runtime")
    fix = memory.fix_oom_runtime(ctx)
    assert fix.edits == [] and fix.summary.startswith("Free the GPU")
    assert any("does not help" in n for n in fix.notes)


LOADING = "INFO 11-03 09:12:40 [gpu_model_runner.py:3460] Starting to load model meta-llama/Llama-3.3-70B-Instruct..."
LOADED = "INFO 11-03 09:13:01 [gpu_model_runner.py:3540] Model loading took 14.99 GiB memory and 6.201 seconds"
OOM = torch_oom("1.96 GiB", 0, "23.55 GiB", "1.21 GiB")


def test_phase_from_milestones(diagnose):
    assert diagnose([LOADING, OOM]).findings[0].rule == "cuda-oom-load"
    assert diagnose([LOADING, LOADED, OOM]).findings[0].rule == "cuda-oom-runtime"
    sampler = ("RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try "
               "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
    assert diagnose([LOADING, sampler]).findings[0].rule == "cuda-oom-runtime"
    graphs = diagnose([LOADING, LOADED, "INFO 11-20 08:00:59 [gpu_worker.py:298] Available KV cache memory: 3.39 GiB",
                       "INFO 04-12 08:22:04 [model_runner.py:1456] Capturing cudagraphs for decoding.", OOM])
    assert graphs.findings[0].rule == "cuda-oom-runtime" and graphs.facts.get(PHASE_FACT) == "graph"


def test_an_old_format_oom_names_memory_held_outside_the_process(diagnose):
    # real/memory rm11 (torch <= 2.0 format): 44.56 - 27.93 reserved - 0.55 free = 16.1 GiB held elsewhere;
    # the reporter said other processes held ~15 GB of that GPU
    line = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total "
            "capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch)")
    top = diagnose(line).findings[0]
    assert top.rule == "cuda-oom-runtime" and top.fix.summary.startswith("Free GPU 0: about 16.1 GiB")
    assert top.unchanged
    # PyTorch's pool is all there is: no foreign memory to blame
    own = line.replace("565.31 MiB free", "16.50 GiB free")
    assert not diagnose(own).findings[0].fix.summary.startswith("Free")


def test_kv_on_the_cpu_backend_gives_the_cache_more_ram(diagnose):
    """The CPU worker's own error names VLLM_CPU_KVCACHE_SPACE: no GPU fix (more GPUs, fp8 weights) is offered."""
    d = diagnose("ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE` "
                 "when initializing the engine.", command="vllm serve facebook/opt-125m")
    fix = d.findings[0].fix
    assert d.findings[0].rule == "kv-cache-insufficient"
    assert SetEnv("VLLM_CPU_KVCACHE_SPACE", "8") in fix.edits
    everything = [fix.summary] + [a.summary for a in fix.alternatives]
    assert not any("--tensor-parallel-size" in t or "--quantization" in t for t in everything), everything


def test_cuda_malloc_async_oom_gives_its_numbers_on_lines_of_their_own(diagnose):
    """PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync words an OOM differently (CUDAMallocAsyncAllocator.cpp):
    its numbers follow on lines of their own, and what the device holds beyond this process is read from them."""
    head = "(EngineCore_DP0 pid=2031) ERROR 10-02 14:11:52 [core.py:708] "
    lines = ["INFO 10-02 14:11:40 [gpu_model_runner.py:1700] Model loading took 14.99 GiB and 6.1 seconds",
             head + "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)",
             head + "Currently allocated     : 71.52 GiB", head + "Requested               : 2.00 GiB",
             head + "Device limit            : 79.19 GiB", head + "Free (according to CUDA): 18.00 MiB"]
    d = diagnose("\n".join(lines) + "\n")
    top = d.findings[0]
    assert top.rule == "cuda-oom-runtime", [f.rule for f in d.findings]
    text = " ".join(top.fix.arithmetic)
    assert "requested 2.00 GiB with 18.00 MiB free on GPU 0 of 79.19 GiB" in text
    assert "79.19 GiB total - 71.52 GiB PyTorch's reserved memory - 18.00 MiB free = 7.65 GiB" in text, text
