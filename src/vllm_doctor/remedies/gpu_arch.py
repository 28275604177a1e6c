"""Remedies for a GPU whose architecture the build or the request does not support: a dtype or quantization below
its compute capability, a kernel compiler or library (PyTorch, Triton, ptxas, FlashInfer, ROCm's) without it."""
from __future__ import annotations

from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.facts import gpus
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.remedies.platform import gpu_devices


def _gpu_cc(ctx: RemedyContext) -> tuple[str | None, float | None]:
    if ctx.capture("cc_major"):
        return ctx.capture("gpu_name"), float(f"{ctx.capture('cc_major')}.{ctx.capture('cc_minor') or '0'}")
    if ctx.capture("capability"):
        return None, int(ctx.capture("capability")) / 10
    for d in gpu_devices(ctx):
        cc = gpus.compute_capability(d)
        if cc:
            return d.get("name"), float(f"{cc[0]}.{cc[1]}")
    return None, None


def _torch_lacks_arch(ctx: RemedyContext, name: str | None, cc: float | None, arithmetic: list, facts_used: dict) -> Fix:
    """PyTorch said this GPU's architecture is not in its build (torch/cuda/__init__.py): the wheels, not the
    flags. `sm_120` -> 12.0."""
    sm = ctx.capture_int("sm")
    if sm:
        name, cc = ctx.capture("gpu_name") or name, sm // 10 + (sm % 10) / 10
        arithmetic = [f"{name or 'this GPU'}: compute capability {cc:.1f} (sm_{sm})"]
        facts_used["compute_capability"] = f"{cc:.1f}"
    gpu = f"{name or 'this GPU'}" + (f" (compute capability {cc:.1f})" if cc else "")
    if cc is not None and cc >= 10.0:
        how = ("Blackwell needs a CUDA 12.8+ build: torch 2.7 or newer from the cu128 (or cu129/cu130) index, and a "
               "vLLM wheel built against that torch")
    elif cc is not None and cc < 7.0:
        how = ("vLLM's wheels start at compute capability 7.0: build vLLM and torch from source with "
               "TORCH_CUDA_ARCH_LIST covering it, or run on a newer GPU")
    else:
        how = "the CUDA build of torch that the installed vLLM release pins (pip install vllm pulls the matching one)"
    return Fix(summary=f"Install a PyTorch build with kernels for {gpu}: the installed torch was not built for "
                       f"it, so its first kernel fails; {how}",
               edits=[], arithmetic=arithmetic, facts_used=facts_used,
               notes=["`python -c 'import torch; print(torch.cuda.get_arch_list())'` lists the architectures the "
                      "installed torch carries."])


def fix_compute_capability(ctx: RemedyContext) -> Fix:
    name, cc = _gpu_cc(ctx)
    arithmetic, notes, facts_used = [], [], {}
    if cc is not None:
        arithmetic.append(f"{name or 'this GPU'}: compute capability {cc:.1f}")
        facts_used["compute_capability"] = f"{cc:.1f}"
    if cc is not None and cc < 7.0:
        notes.append(f"vLLM's CUDA builds support compute capability 7.0 (Volta) and newer; {name or 'this GPU'} "
                     f"({cc:.1f}) is below that whatever the flags.")
    if ctx.has_pattern("bf16", "v1-forced") or ctx.capture("raised_in") == "_check_if_gpu_supports_dtype":
        edits = [SetFlag("--dtype", "float16")]
        if ctx.has_pattern("v1-forced"):
            edits.append(SetEnv("VLLM_USE_V1", "0"))
        return Fix(summary="Use --dtype float16: bfloat16 needs compute capability 8.0 or newer"
                           + (f" and {name} has {cc:.1f}" if name and cc else ""),
                   edits=edits, arithmetic=arithmetic + ["bfloat16 needs ≥ 8.0 (Ampere)"], facts_used=facts_used,
                   notes=notes + ["float16 has a smaller range than bfloat16: a model trained in bf16 can overflow in "
                          "rare cases (NaN/inf outputs); float32 avoids that at twice the memory."],
                   alternatives=[Alternative("--dtype float32", [SetFlag("--dtype", "float32")],
                                             "twice the weight and activation memory, slower")])
    if ctx.has_pattern("quant-min-capability"):
        q = ctx.capture("quantization") or "this quantization"
        need, has = ctx.capture_int("min_capability"), ctx.capture_int("capability")
        if need is not None:          # a paste that re-wrapped the message may have left its numbers out
            arithmetic.append(f"{q} needs capability {need} (= {need / 10:.1f})"
                              + (f", the GPU has {has} (= {has / 10:.1f})" if has is not None else ""))
        else:
            arithmetic.append(f"vLLM's minimum-capability check for {q} refused this GPU")
        alts = [Alternative("drop FP8 KV cache", [RemoveFlag("--kv-cache-dtype")], "more KV-cache memory")] \
            if "fp8" in q else []
        return Fix(summary=f"Use a checkpoint quantized in a format this GPU supports (e.g. AWQ/GPTQ int4 on 7.5+) or "
                           f"the unquantized model: {q} needs a newer GPU",
                   edits=[RemoveFlag("--quantization")] if ctx.flag("--quantization") is not None else [],
                   alternatives=alts, arithmetic=arithmetic, facts_used=facts_used,
                   notes=["FP8 runs natively from compute capability 8.9 (Ada) / 9.0 (Hopper); on Ampere vLLM "
                          "can only use weight-only FP8 (Marlin) in some versions."])
    if ctx.has_pattern("kv-dtype-needs-newer-gpu"):
        dtype = ctx.capture("kv_cache_dtype") or "auto"
        return Fix(summary=f"Use --kv-cache-dtype {dtype}, as vLLM says: this KV-cache dtype needs a newer GPU "
                           "(native FP8 from 8.9, bfloat16 from 8.0)",
                   edits=[SetFlag("--kv-cache-dtype", dtype)], arithmetic=arithmetic, facts_used=facts_used,
                   notes=notes)
    if ctx.has_pattern("torch-arch", "torch-arch-cc", "torch-arch-cc-new"):
        return _torch_lacks_arch(ctx, name, cc, arithmetic, facts_used)
    built = _no_kernel_for_this_gpu(ctx, arithmetic, facts_used, notes)
    if built is not None:
        return built
    if ctx.has_pattern("no-kernel-image"):
        return Fix(summary="Use a vLLM build compiled for this GPU: the installed one has no CUDA kernels for its "
                           "architecture (vLLM's wheels target compute capability 7.0+; build from source with "
                           "TORCH_CUDA_ARCH_LIST set to the GPU's capability, e.g. \"6.1\", or run on a newer GPU)",
                   edits=[], arithmetic=arithmetic, facts_used=facts_used, notes=notes)
    if ctx.has_pattern("triton-fp8", "triton-fp8-arch"):
        return Fix(summary="Do not use FP8 (e.g. remove --kv-cache-dtype fp8) on this GPU: Triton's fp8e4nv needs "
                           "compute capability 8.9+",
                   edits=[RemoveFlag("--kv-cache-dtype")] if ctx.flag("--kv-cache-dtype") is not None else [],
                   arithmetic=arithmetic + [f"Triton's {ctx.capture('fp8_type') or 'fp8e4nv'} kernels need compute "
                                            "capability 8.9 (Ada, Hopper) or newer"], facts_used=facts_used,
                   notes=["An FP8 KV cache may still run where no Triton kernel reads it (the FlashInfer or "
                          "FlashAttention backend); chunked prefill and prefix caching use Triton's prefix-prefill "
                          "kernel."])
    # attention backend requirements
    edits: list = []
    if ctx.flag("--attention-backend") is not None:
        edits.append(RemoveFlag("--attention-backend"))
    if ctx.env("VLLM_ATTENTION_BACKEND"):
        notes.append("Unset VLLM_ATTENTION_BACKEND (it forces a backend this GPU cannot run).")
    if ctx.has_pattern("flashinfer-sinks"):
        summary = ("Use the FlashAttention backend (--attention-backend FLASH_ATTN): FlashInfer supports attention "
                   "sinks only through TRT-LLM kernels on Blackwell")
        edits = [SetFlag("--attention-backend", "FLASH_ATTN")]
    else:
        summary = ("Let vLLM pick an attention backend this GPU supports (remove the forced backend; on compute "
                   "capability < 8.0 FlashAttention-2 is unavailable)")
    return Fix(summary=summary, edits=edits, arithmetic=arithmetic, facts_used=facts_used, notes=notes)


def _no_kernel_for_this_gpu(ctx: RemedyContext, arithmetic: list, facts_used: dict, notes: list) -> Fix | None:
    """The kernel cannot exist for this GPU: ROCm's libraries without its gfx architecture, a kernel compiler
    (ptxas, Triton, FlashInfer's JIT) that does not know it or that it is too old for, a kernel's own check."""
    def fix(summary: str, said: str | None = None, told: str | None = None, edits: list | None = None) -> Fix:
        return Fix(summary=summary, edits=edits or [], arithmetic=arithmetic + ([said] if said else []),
                   facts_used=facts_used, notes=notes + ([told] if told else []))

    if ctx.has_pattern("rocblas-no-arch", "hip-no-binary"):
        arch = ctx.capture("gpu_arch")
        gpu = arch or "this GPU's architecture"
        return fix(f"Use a ROCm build (PyTorch and vLLM, or the image) compiled for {gpu}: the installed one carries "
                   "no kernels for it", f"the GPU is {arch}" if arch else None,
                   "rocBLAS lists the architectures it has on the lines after its error. Setting "
                   "HSA_OVERRIDE_GFX_VERSION to a listed one of the same generation (e.g. 11.0.0 for gfx1100) makes "
                   "the GPU pass as it: unsupported by AMD, it can crash or give wrong results.")
    if ctx.has_pattern("ptxas-target", "ptxas-gpu-name"):
        target = ctx.capture("sm_target") or "this GPU's architecture"
        return fix(f"Use a vLLM build (its image, torch and Triton) that knows {target}: the kernel compiler in this "
                   "one predates the GPU (Blackwell's sm_120/sm_121 need CUDA 12.8+ toolchains)",
                   f"ptxas was asked for {target} and does not know it",
                   "TRITON_PTXAS_PATH pointing at the ptxas of a newer CUDA toolkit on the host is the known stop-gap "
                   "for Triton's bundled one.")
    if ctx.has_pattern("triton-too-old-gpu"):
        return fix(f"Run on a GPU of compute capability {ctx.capture('min_cc') or '7.0'} or newer: "
                   f"{ctx.capture('gpu_name') or 'this GPU'} is below what Triton (torch.compile's backend) and vLLM's "
                   "own kernels support", None,
                   "Turning torch.compile off (--enforce-eager, or compilation level 0) only moves the failure: "
                   "vLLM's CUDA kernels also need 7.0; community Pascal builds exist.")
    if ctx.has_pattern("triton-conversion"):
        src, dst = ctx.capture("from_type") or "?", ctx.capture("to_type") or "?"
        half = src in ("f16", "bf16") and dst in ("f16", "bf16")
        return fix("Run on a GPU of compute capability 7.0 or newer: Triton, which compiles vLLM's kernels, has no "
                   f"{src} -> {dst} conversion for this one"
                   + ("; on a Pascal GPU --dtype float32 keeps Triton off half precision (slower, twice the memory)"
                      if half else ""),
                   f"Triton aborted compiling a {src} -> {dst} conversion",
                   "Triton's oldest supported NVIDIA GPU is sm_70 (Volta); fp8 conversions need sm_89 or newer.",
                   [SetFlag("--dtype", "float32")] if half else None)
    if ctx.has_pattern("kernel-sm-only"):
        sms = ctx.capture("sm_list") or "?"
        return fix(f"Choose another backend for the layer that failed: its kernel runs only on SM {sms} (attention: "
                   "--attention-backend TRITON_ATTN or FLASH_ATTN; a vision encoder's attention: "
                   "--mm-encoder-attn-backend), or run on a GPU of that generation",
                   f"the kernel asserts SM {sms}; this GPU is another generation",
                   "The frames above the assertion name the kernel (flash_fwd_sm100: FlashAttention-4's CuTe kernels "
                   "for Blackwell datacenter GPUs).")
    if ctx.has_pattern("deepgemm-arch"):
        return fix("Turn DeepGEMM off (VLLM_USE_DEEP_GEMM=0): its kernels exist for Hopper (sm_90) and Blackwell "
                   "(sm_100) only, and this GPU is neither", None,
                   "vLLM then uses its CUTLASS or Triton kernels for the same layers.",
                   [SetEnv("VLLM_USE_DEEP_GEMM", "0")])
    if ctx.has_pattern("flashinfer-no-arch"):
        majors = ctx.capture("arch_majors") or "?"
        return fix(f"Choose another kernel backend for this GPU: FlashInfer builds this kernel only for architecture "
                   f"{majors}.x (attention: --attention-backend TRITON_ATTN or FLASH_ATTN; NVFP4 GEMM: "
                   "VLLM_NVFP4_GEMM_BACKEND=cutlass)",
                   f"FlashInfer's kernel targets major {majors}; the GPU is not one",
                   "On an sm_12x GPU the same error means FlashInfer's JIT found a CUDA toolkit older than 12.9: one "
                   "that knows the GPU (CUDA_HOME) lets it build.")
    return None
