"""Start-up phases of a vLLM worker, read from a traceback's frames or from the milestones the log printed.

Where in the start-up a failure happened decides its fix (an OOM while loading weights needs more GPUs
or a smaller checkpoint; one in the profiling run or the KV allocation needs a smaller budget).
"""
from __future__ import annotations

PHASE_FACT = "memory.oom_phase"     # set by the OOM refine hook so the remedy knows where the OOM happened

# Functions in a traceback that place an OOM in weight loading vs. after it (vLLM's worker start-up order: load, profile, KV allocation, graph capture).
LOAD_FUNCS = {"load_model", "load_weights", "get_model", "initialize_model", "_initialize_model",
              "load_weights_and_postprocess", "_load_weights", "weight_loader", "make_layers",
              "create_weights", "_init_model", "init_model",
              "process_weights_after_loading"}   # the loader's repacking (Marlin) after load_weights: still loading
RUNTIME_FUNCS = {
    "profile_run": "profile", "_dummy_run": "profile", "determine_num_available_blocks": "profile",
    "determine_available_memory": "profile", "_dummy_sampler_run": "sampler",
    "_dummy_pooler_run": "sampler", "capture_model": "graph", "capture": "graph",
    "capture_end": "graph", "_capture_cudagraphs": "graph", "profile_cudagraph_memory": "graph",
    "graph_capture": "graph", "_allocate_kv_cache": "kv_alloc",
    "initialize_kv_cache": "kv_alloc", "_allocate_kv_cache_tensors": "kv_alloc",
    "initialize_kv_cache_tensors": "kv_alloc", "initialize_cache": "kv_alloc",
    "execute_model": "serving", "step": "serving",
    # device and communicator set-up: nothing of vLLM's own is allocated yet
    "init_device": "init", "init_worker_distributed_environment": "init", "init_distributed_environment": "init",
    "initialize_model_parallel": "init", "ensure_model_parallel_initialized": "init",
}
INIT_FILES = ("pynccl", "custom_all_reduce")      # their __init__ allocates NCCL / all-reduce buffers
# a layer's or a model's __init__ creates its parameters on the GPU as vLLM builds the model (initialize_model under
# torch.device): an OOM there is the weights not fitting, even where the paste kept only the innermost frames
MODEL_FILES = ("/model_executor/layers/", "/model_executor/models/")
PHASE_NAMES = {"init": "device and communicator set-up, before any weight or KV-cache allocation",
               "load": "loading the weights", "profile": "the memory-profiling run",
               "graph": "CUDA-graph capture", "sampler": "the sampler warm-up",
               "kv_alloc": "allocating the KV cache", "serving": "serving requests"}


def classify_frames(funcs: list[str], files: list[str] | None = None) -> str | None:
    """Phase from traceback frames (outermost first): the innermost frame that names a phase wins."""
    files = files or [""] * len(funcs)
    for func, file in zip(reversed(funcs), reversed(files)):
        if func in RUNTIME_FUNCS:
            return RUNTIME_FUNCS[func]
        if func == "__init__" and any(name in (file or "") for name in INIT_FILES):
            return "init"
        if func in LOAD_FUNCS or "/model_loader/" in (file or "").replace("\\", "/"):
            return "load"
    # no frame names a phase: a layer's own __init__ is the model being built (a lazily built module inside a
    # profiling run is named by that run's frame above it)
    if any(func == "__init__" and any(part in (file or "").replace("\\", "/") for part in MODEL_FILES)
           for func, file in zip(funcs, files)):
        return "load"
    return None


def classify_milestones(milestones: set[str] | None) -> str | None:
    ms = set(milestones or ())
    if "server_ready" in ms or "engine_ready" in ms or "serving" in ms:
        return "serving"
    if "graph_capture" in ms:
        return "graph"
    if "kv_cache_sized" in ms:
        return "kv_alloc"
    if "weights_loaded" in ms:
        return "profile"
    if "weights_loading" in ms:
        return "load"
    return None
