"""Model facts: find the model's files offline (a directory or the Hugging Face cache), read its config
without ever executing model code, and estimate its weight bytes from headers only."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from vllm_doctor.numbers import json_loads

from . import Facts
from .model_config import SOURCE, normalise
from .model_table import BYTES_16BIT, NOTICE_MARK
from .weights import estimate_weights

AUX_FILES = ("config.json", "tokenizer_config.json", "model.safetensors.index.json")
# model_types whose config class vLLM ships itself (`_CONFIG_REGISTRY` in vllm/transformers_utils/config.py,
# the union over releases): transformers not knowing the type is no sign that it is too old.
VLLM_OWN_CONFIGS = frozenset((
    "RefinedWeb", "RefinedWebModel", "mpt", "dbrx", "chatglm", "jais", "mlp_speculator", "medusa", "eagle",
    "exaone", "h2ovl_chat", "internvl_chat", "nemotron", "NVLM_D", "solar", "ultravox", "mllama", "afmoe",
    "bagel", "deepseek_vl_v2", "deepseek_v32", "flex_olmo", "funaudiochat", "hunyuan_vl", "isaac",
    "kimi_linear", "kimi_vl", "kimi_k25", "midashenglm", "speculators", "olmo3", "ovis", "vibevoice",
    "step3_vl", "step3_text", "qwen3_asr", "qwen3_next", "lfm2_moe", "tarsier2"))
# of those, the ones whose auto_map does not force --trust-remote-code: their tokenizers are standard too
# (InternVL's and ChatGLM's ship their own tokenizer code, which vLLM still refuses to run without the flag)
REMOTE_CODE_EXEMPT = ("RefinedWeb", "RefinedWebModel", "mpt", "dbrx")


def transformers_knows(model_type: str) -> tuple[bool | None, str | None]:
    """(whether the installed transformers has a config class for `model_type`, its version); (None, None)
    when transformers is not importable. Reads transformers' own table, loads no model code."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # silence the "no PyTorch" notice
    try:
        from importlib.metadata import version

        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        return model_type in CONFIG_MAPPING_NAMES, version("transformers")
    except Exception:  # noqa: BLE001 - not installed, a broken install
        return None, None


def hf_cache_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Hub cache folders in huggingface_hub's order of precedence."""
    env = os.environ if environ is None else environ
    dirs = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            dirs.append(Path(env[var]).expanduser())
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]).expanduser() / "hub")
    xdg = env.get("XDG_CACHE_HOME")
    dirs.append((Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub")
    return list(dict.fromkeys(dirs))


def _snapshot_in(cache: Path, repo_id: str) -> Path | None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if (pinned / "config.json").is_file():
            return pinned
    candidates = [p for p in snapshots.iterdir() if (p / "config.json").is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def resolve_model_dir(model: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """A local directory holding config.json for `model` (a path or an org/name repo id), or None."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path if (path / "config.json").is_file() else None
    if model.count("/") > 1 or model.startswith((".", "/", "~")):
        return None  # a path that does not exist, not a repo id
    for cache in hf_cache_dirs(environ):
        snap = _snapshot_in(cache, model)
        if snap is not None:
            return snap
    return None


def _download(model: str) -> Path | None:
    """online=True only: fetch the small metadata files (never weights) into the HF cache."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    found = None
    for name in AUX_FILES:
        try:
            found = Path(hf_hub_download(model, name)).parent if name == "config.json" else found
            if name != "config.json":
                hf_hub_download(model, name)
        except Exception:  # noqa: BLE001 - optional files may be missing; network errors are notices
            if name == "config.json":
                return None
    return found


def _read_json(path: Path) -> dict | None:
    try:
        data = json_loads(path.read_text(encoding="utf-8", errors="replace"))  # NaN, 1e999, 5000 digits: null
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _transformers_config(model_dir: Path) -> tuple[dict | None, str | None]:
    """The config as transformers builds it (with class defaults), never trusting remote code."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # silence the "no PyTorch" notice
    try:
        from transformers import AutoConfig  # imported only once a model dir exists: it costs ~1 s
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
        return config.to_dict(), None
    except Exception as exc:  # noqa: BLE001 - unknown model_type, remote code, broken install
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()


ESSENTIAL = ("model.num_attention_heads", "model.num_kv_heads", "model.num_layers", "model.hidden_size",
             "model.vocab_size")


def load_model_facts(model: str, facts: Facts, *, online: bool = False, table: bool = False) -> str | None:
    """Set model.* facts for `model`; returns a one-line notice (not found, fallback used) or None. With
    `table`, a model found nowhere here is looked up in the shipped table (a saved log's diagnosis does
    not: the log itself prints the numbers its failure is about)."""
    model_dir = resolve_model_dir(model)
    if model_dir is None and online:
        model_dir = _download(model)
    if model_dir is None:
        where = "online" if online else "locally (directory or Hugging Face cache; --online to fetch)"
        found = _from_table(model, facts) if table else None
        return found or f"model {model!r} not found {where}: model facts unavailable"
    raw = _read_json(model_dir / "config.json")
    if raw is None:
        return f"{model_dir / 'config.json'} is not valid JSON: model facts unavailable"
    tokenizer_cfg = _read_json(model_dir / "tokenizer_config.json")
    plain = normalise(raw, tokenizer_cfg)
    # transformers costs ~1 s to import: ask it only when the plain JSON leaves the question open
    # (auto_map: does transformers know the model natively? essential sizes missing: class defaults).
    if raw.get("auto_map") or any(plain.get(k) is None for k in ESSENTIAL):
        loaded, error = _transformers_config(model_dir)
    else:
        loaded, error = None, None
    notice = None
    cfg: dict[str, Any] = raw
    if loaded is not None:
        cfg = {**loaded, "auto_map": raw.get("auto_map")}
    elif error is None:
        pass                                   # complete plain config.json, read without transformers
    elif raw.get("auto_map"):
        notice = "config.json needs remote code (auto_map): read as JSON without executing it"
    else:
        notice = f"transformers could not load the config ({error[:120]}); read config.json directly"
    values = plain if cfg is raw else normalise(cfg, tokenizer_cfg)
    # auto_map only forces --trust-remote-code when transformers has no native class for the model.
    values["model.needs_remote_code"] = (bool(raw.get("auto_map")) and loaded is None
                                         and raw.get("model_type") not in REMOTE_CODE_EXEMPT)
    values["model.has_auto_map"] = bool(raw.get("auto_map"))
    values["model.path"] = str(model_dir)
    values["model.config_loader"] = "transformers" if loaded is not None else "json"
    size, dtypes, method = estimate_weights(model_dir)
    values["model.weight_bytes"] = size
    values["model.weight_dtypes"] = dtypes or None
    values["model.weight_bytes_method"] = method
    for key, value in values.items():
        facts.set(key, value, SOURCE)
    return notice


TABLE_SOURCE = "model table"


def _from_table(model: str, facts: Facts) -> str | None:
    """No config.json here: a popular model's published numbers from the shipped table, said so (notice)."""
    from .model_table import lookup

    row = lookup(model)
    if row is None:
        return None
    values = normalise(row.config, None)
    values["model.needs_remote_code"] = row.remote_code
    values["model.has_auto_map"] = row.remote_code
    values["model.config_loader"] = TABLE_SOURCE
    values["model.config_source"] = row.source
    values["model.weight_bytes"] = row.weight_bytes
    values["model.weight_bytes_method"] = (f"{TABLE_SOURCE}: {row.parameters / 1e9:g}B parameters x {BYTES_16BIT} bytes"
                                           if row.weight_bytes == int(row.parameters * BYTES_16BIT)
                                           else f"{TABLE_SOURCE}: the quantized checkpoint's size")
    for key, value in values.items():
        if value is not None:
            facts.set(key, value, TABLE_SOURCE)
    return (f"model {model!r} is not on this machine: its architecture is {NOTICE_MARK} "
            f"({row.source}); a fine-tune with another shape needs --model DIR or --online")

