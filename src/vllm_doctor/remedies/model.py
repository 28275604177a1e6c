"""Remedies for a model that cannot be loaded: not found (a typo, a path outside the container's mounts, a gated
or private repository, offline mode) and a transformers release too old for the checkpoint's model type."""
from __future__ import annotations

import difflib
import os

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext


# ---------------------------------------------------------------- model-not-found

def _looks_local(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or "\\" in model


def _near_dirs(path: str) -> list[str]:
    """Directories next to a missing local path whose names are close to it (this machine only)."""
    path = os.path.expanduser(path.rstrip("/"))
    parent, base = os.path.split(path)
    if not parent or not os.path.isdir(parent) or os.path.exists(path):
        return []
    try:
        entries = [e for e in os.listdir(parent) if os.path.isdir(os.path.join(parent, e))]
    except OSError:
        return []
    close = difflib.get_close_matches(base, entries, n=3, cutoff=0.6) or [e for e in entries
                                                                        if e.lower() == base.lower()]
    return [os.path.join(parent, c) for c in close]


def _docker_mounts(ctx: RemedyContext) -> list[str]:
    """The container paths of the command's volume mounts (-v HOST:PATH[:ro])."""
    volumes = ctx.command.docker_values("--volume") if ctx.command is not None else []
    return [path for v in volumes for path in (v or "").split(":")[1:2] if path.startswith("/")]


def _fix_offline(ctx: RemedyContext, model: str, shown: str) -> Fix:
    if ctx.env("HF_HUB_OFFLINE") == "1" or ctx.has_pattern("offline-cache", "offline-mode"):
        return Fix(f"Set HF_HUB_OFFLINE=0 so {shown} can be downloaded, or download it first "
                   f"(`huggingface-cli download {model or 'REPO'}`) and serve the local path",
                   [SetEnv("HF_HUB_OFFLINE", "0")],
                   alternatives=[Alternative(f"Keep offline mode: run `huggingface-cli download {model or 'REPO'}` "
                                             "on a machine with network access and copy the cache "
                                             "(~/.cache/huggingface) or serve the downloaded directory", [],
                                             "a manual download")],
                   notes=["Offline mode (HF_HUB_OFFLINE=1 / TRANSFORMERS_OFFLINE=1) only works for files already "
                          "in the local Hugging Face cache."], facts_used={"model": model})
    host = ctx.capture("hub_host")
    why = f" ({host}: {ctx.capture('hub_error') or 'no answer'})" if host else ""
    notes = ["On a slow link, HF_HUB_DOWNLOAD_TIMEOUT=60 and HF_HUB_ETAG_TIMEOUT=60 give the hub more time (10 s "
             "each by default)."] if host else []
    return Fix(f"The Hugging Face hub could not be reached{why}: check network/proxy (HTTPS_PROXY, HF_ENDPOINT) or "
               f"download {shown} beforehand and serve the local directory", [], notes=notes,
               facts_used={"model": model})


def _fix_local_path(ctx: RemedyContext, model: str) -> Fix:
    near = _near_dirs(model)
    if near:
        return Fix(f"Use --model {near[0]}: {model} does not exist, a directory with a close name does",
                   [SetFlag("--model", near[0])],
                   alternatives=[Alternative(f"Use {p}", [SetFlag("--model", p)], "another directory: check it "
                                             "holds the model you meant") for p in near[1:]],
                   facts_used={"model": model, "nearby": near})
    notes, mounts = [], _docker_mounts(ctx)
    if mounts and not any(model == m or model.startswith(m.rstrip("/") + "/") for m in mounts):
        notes.append(f"The container only mounts {', '.join(mounts)}; {model} is not under any of them. Mount the "
                     f"host directory there (-v /host/dir:{model}) or point --model into a mounted path.")
    return Fix(f"Check the model path {model}: it must be an existing directory (inside the container, when one "
               f"is used) containing config.json (params.json for Mistral-format models)", [], notes=notes,
               facts_used={"model": model})


def _fix_model_source(ctx: RemedyContext, model: str) -> Fix | None:
    """Where the model was to come from does not hold it: ModelScope's hub, or a cache directory that is not there."""
    if ctx.has_pattern("modelscope-not-exist"):
        return Fix(f"Check the model id and revision on ModelScope ({ctx.capture('hub_error')}): VLLM_USE_MODELSCOPE "
                   "makes vLLM download from modelscope.cn, where the id and the revision it asks for must exist; unset it "
                   "to load from Hugging Face", [],
                   facts_used={"model": model, "hub": "modelscope"})
    if ctx.has_pattern("cache-dir-missing"):
        cache = ctx.capture("cache_dir") or "the cache directory"
        return Fix(f"Mount or create {cache}, or point HF_HOME / HF_HUB_CACHE at the directory that holds the model: "
                   "the Hugging Face cache the server reads from does not exist", [],
                   facts_used={"model": model, "cache_dir": cache})
    return None


def fix_model_not_found(ctx: RemedyContext) -> Fix | None:
    model = str(ctx.capture("model") or ctx.arg("model") or "").strip().rstrip(".")
    shown = model or "the model"
    # a bare 401 from requests: the hub answers it for a gated/private repo and for an id that does not exist
    # when no token is sent; huggingface_hub's own class (RepositoryNotFoundError) decides where it is printed
    auth_only = ctx.has_pattern("hub-auth", "hub-auth-httpx") and not ctx.has_pattern("repo-not-found",
                                                                                     "repo-not-found-url")
    if (fix := _fix_model_source(ctx, model)) is not None:
        return fix
    if ctx.has_pattern("hub-rate-limit"):
        return Fix("The Hugging Face hub rate-limited the downloads (429): set HF_TOKEN (logged-in requests get a "
                   "higher limit) and retry in a few minutes, or download once and serve the local directory",
                   [SetEnv("HF_TOKEN", "<your-hf-token>")], facts_used={"model": model})
    if ctx.has_pattern("hf-transfer-missing"):
        return Fix("Install hf_transfer (`pip install hf_transfer`) or unset HF_HUB_ENABLE_HF_TRANSFER: the variable "
                   "asks for a package this environment lacks", [], facts_used={"model": model})
    gated = ("gated", "gated-url", "gated-oserror", "gated-has-file")
    if ctx.has_pattern("hub-bad-token") and not ctx.has_pattern(*gated):
        return Fix("Replace the Hugging Face token: the hub rejected the one sent (HF_TOKEN, or the one "
                   "`huggingface-cli login` stored) as invalid or revoked; create a new read token at "
                   "https://huggingface.co/settings/tokens and set HF_TOKEN to it", [SetEnv("HF_TOKEN", "<your-hf-token>")],
                   notes=["A stale HF_TOKEN in the environment wins over the login's stored token; `unset HF_TOKEN` "
                          "if the stored one is the good one."], facts_used={"model": model})
    if ctx.has_pattern(*gated) or auth_only:
        repo = model or "the repository"
        return Fix(f"Authenticate for the gated repo {repo}: accept its licence on https://huggingface.co/{repo} "
                   f"with your account, then `huggingface-cli login` or set HF_TOKEN",
                   [SetEnv("HF_TOKEN", "<your-hf-token>")],
                   notes=["The token must belong to an account that was granted access to the gated model; a token "
                          "alone is not enough (403 = authenticated but not on the access list, 401 = no/invalid "
                          "token). In docker pass it with -e HF_TOKEN=..."]
                   + (["A 401 alone does not prove the repo exists: the hub gives it for a mistyped id too when "
                       "no token is sent; check the id if a token does not help."]
                      if auth_only and ctx.capture("status") == "401" else []),
                   facts_used={"model": model})
    repo_like = "/" in model and not model.startswith(("/", ".", "~"))
    offline_env = "1" in (ctx.env("HF_HUB_OFFLINE"), ctx.env("TRANSFORMERS_OFFLINE"))
    if ctx.has_pattern("no-weights"):
        fmt = "*.safetensors" if ctx.capture("weights_format") else "*.safetensors or *.bin/*.pt"
        load = ctx.arg("load_format")
        return Fix(f"{shown} holds no weight files the loader looks for ({fmt}): finish the download "
                   f"(`huggingface-cli download <repo> --local-dir {shown}` resumes it) or point --model at the "
                   f"directory that has them", [],
                   notes=[f"--load-format {load} only reads its own format"] if load and load != "auto" else [],
                   facts_used={"model": model})
    if ctx.has_pattern("xet-download"):
        return Fix(f"Retry the download of {shown}; if Xet storage keeps failing ({ctx.capture('xet_error')}), set "
                   "HF_HUB_DISABLE_XET=1 to download over plain HTTPS", [SetEnv("HF_HUB_DISABLE_XET", "1")],
                   facts_used={"model": model})
    if ctx.has_pattern("hub-download-cut"):
        got, want = ctx.capture_int("got_size"), ctx.capture_int("expected_size")
        return Fix(f"Rerun: the download of {ctx.capture('hub_file') or shown} was cut ({got:,} of {want:,} bytes); if "
                   f"it repeats, `huggingface-cli download {model or 'REPO'} --force-download` on a steadier link",
                   [], facts_used={"model": model})
    if ctx.has_pattern("bad-revision", "revision-not-found"):
        revision = ctx.capture("revision") or ctx.arg("revision") or "the revision"
        return Fix(f"Check --revision {revision}: no branch, tag or commit of that name exists for {shown} (the "
                   f"model page's 'Files and versions' lists them); leave --revision out for the default branch", [],
                   facts_used={"model": model, "revision": revision})
    if ctx.has_pattern("offline", "offline-cache", "offline-mode", "hub-unreachable", "hub-timeout", "hub-retry",
                       "hub-5xx", "hub-5xx-httpx") or (
            repo_like and offline_env):
        return _fix_offline(ctx, model, shown)   # "invalid repository" for a repo id while offline: not cached
    if model and _looks_local(model):
        return _fix_local_path(ctx, model)
    if ctx.has_pattern("no-config", "no-config-file"):
        missing = ctx.capture("missing_file") or "config.json/params.json"
        return Fix(f"{shown} has no {missing}: point --model at the directory that holds the model's files (a LoRA "
                   "adapter is served with --enable-lora --lora-modules NAME=PATH on its base model, not as --model)",
                   [], facts_used={"model": model})
    if ctx.capture("hub"):
        return Fix(f"Check the ModelScope id {shown}: VLLM_USE_MODELSCOPE makes vLLM look it up on modelscope.cn, where "
                   f"it does not exist (ModelScope ids differ from the hub's); use the ModelScope id, or unset "
                   f"VLLM_USE_MODELSCOPE to use huggingface.co", [], facts_used={"model": model})
    return Fix(f"Check the repository id {shown}: it does not exist on huggingface.co or is private (log in with "
               f"`huggingface-cli login` / HF_TOKEN if it is yours)", [], facts_used={"model": model})


# ---------------------------------------------------------------- transformers-too-old

def fix_transformers_too_old(ctx: RemedyContext) -> Fix | None:
    """The release that first knows the model type (the shipped table) and, where this vLLM's own pin excludes
    it, the vLLM release that admits it: an upgrade pip would refuse or undo is no fix."""
    from vllm_doctor.facts import transformers_releases as tr

    model_type = ctx.capture("model_type")
    versions = ctx.fact("env.versions") or {}
    installed = versions.get("transformers") if isinstance(versions, dict) else None
    what = f"model type '{model_type}'" if model_type else "the checkpoint's model type"
    have = f" (installed: transformers {installed})" if installed else ""
    need = tr.first_release(model_type)
    facts = {"transformers": installed or "unknown", "model_type": model_type or "unknown"}
    source_alt = Alternative("For a model newer than the latest transformers release: pip install "
                             "git+https://github.com/huggingface/transformers.git", [], "an unreleased transformers")
    if need is None:
        arith = ([f"model type '{model_type}' is in no transformers release up to {tr.newest_read()} (the releases "
                  f"read): newer than those, or the checkpoint's own type"] if model_type else [])
        return Fix(f"Upgrade transformers (pip install -U transformers): the installed one{have} does not know {what}; "
                   f"then run the same command", [], alternatives=[source_alt], arithmetic=arith,
                   notes=["If the installed vLLM pins an older transformers, upgrade vLLM as well (a newer vLLM also "
                          "brings the model implementation)."], facts_used=facts)
    earliest = " or earlier" if need == tr.oldest_read() else ""     # no older release was read
    arith = [f"model type '{model_type}' first appears in transformers {need}{earliest}"
             + (f"; installed: {installed}" if installed else "")]
    facts["transformers_needed"] = need
    version = ctx.launch_version
    pin = tr.vllm_requires(version)
    upgrade_vllm = None
    if pin is not None and tr.allows_any_from(pin[1], need) is False:
        upgrade_vllm = tr.first_vllm_allowing(need, after=version)
        arith.append(f"vLLM {version} requires transformers {pin[1]} (as vLLM {pin[0]}'s wheel says), "
                     f"which admits no release from {need} on")
        facts["vllm_transformers_pin"] = pin[1]
    if upgrade_vllm:
        cmd = f"pip install -U 'vllm>={upgrade_vllm}' 'transformers>={need}'"
        summary = (f"Upgrade vLLM and transformers ({cmd}): {what} needs transformers {need} or newer, and vLLM "
                   f"{version} does not accept it; vLLM {upgrade_vllm} is the first release read that does")
    else:
        cmd = f"pip install -U 'transformers>={need}'"
        summary = f"Upgrade transformers ({cmd}): the installed one{have} does not know {what}, {need} is the first " \
                  f"release that does; then run the same command"
    notes = [] if upgrade_vllm or pin is not None else [
        "If the installed vLLM pins an older transformers, upgrade vLLM as well (a newer vLLM also brings the model "
        "implementation)."]
    return Fix(summary, [], arithmetic=arith, notes=notes, facts_used=facts)
