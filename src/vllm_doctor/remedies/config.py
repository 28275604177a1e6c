"""Remedies for configuration, CLI and model errors (rules/cli-*.toml, model-*.toml, ...).

Every edit goes through the command model (vllm_doctor.command); flag knowledge (renames, removals,
did-you-mean, choices) comes from vllm_doctor.command.flags at the vLLM version the log shows.
"""
from __future__ import annotations

import difflib
import os
import re
import socket
from typing import Any

from vllm_doctor.command import edits as E
from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.numbers import as_int
from vllm_doctor.remedies.base import Alternative, Fix, RemedyContext


def pattern_name(m): return m.pattern.name  # noqa: E704  (stop-gap while config.py is converted)
def pattern_names(ctx): return ctx.pattern_names  # noqa: E704
def env_value(ctx, name): return ctx.env(name)  # noqa: E704

IMAGE_VERSION = re.compile(r"vllm/vllm-openai:v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)")
LAUNCH_WORDS = {"vllm", "serve", "python", "python3", "-m", "vllm.entrypoints.openai.api_server",
                "vllm.entrypoints.api_server", "vllm.entrypoints.cli.main"}
NUMBER_WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9, "ten": 10, "sixteen": 16, "thirty-two": 32}
# values of the removed --task and what replaced them (vllm-flags-history.md: --runner/--convert, 0.10.1+)
TASK_TO_RUNNER = {"embed": ("pooling", "embed"), "embedding": ("pooling", "embed"),
                  "classify": ("pooling", "classify"), "score": ("pooling", "classify"),
                  "reward": ("pooling", "reward"), "generate": ("generate", None), "auto": (None, None)}


def _flags():
    from vllm_doctor.command import flags
    return flags


# ---------------------------------------------------------------- helpers

def _version(ctx: RemedyContext) -> str | None:
    """The vLLM version the log was produced by: the log's own banner, else a docker image tag."""
    version = ctx.facts.get("vllm.version")
    if version:
        return str(version)
    texts = [ctx.facts.get("launch.command")]
    if ctx.command is not None:
        try:
            texts.append(ctx.command.render())
        except Exception:
            pass
    for text in texts:
        m = IMAGE_VERSION.search(str(text or ""))
        if m:
            return m.group(1)
    return None


def _pattern_names(ctx: RemedyContext) -> list[str]:
    """The matches' pattern names in log order (the first decides where order matters)."""
    return [pattern_name(m) for m in ctx.matches or []]


def _layout(ctx: RemedyContext):
    return getattr(ctx.command, "layout", None) if ctx.command is not None else None


def _shape(ctx: RemedyContext) -> str:
    cmd = ctx.command
    for attr in ("shape",):
        value = getattr(cmd, attr, None) if cmd is not None else None
        if isinstance(value, str):
            return value
    lay = _layout(ctx)
    if lay is not None and isinstance(getattr(lay, "shape", None), str):
        return lay.shape
    text = str(ctx.facts.get("launch.command") or "")
    if re.search(r"\b(docker|podman)\s+(container\s+)?run\b", text):
        return "docker"
    return "unknown"


def _command_tokens(ctx: RemedyContext) -> list[str]:
    cmd = ctx.command
    if cmd is None:
        return []
    for attr in ("tokens", "argv"):
        value = getattr(cmd, attr, None)
        if callable(value):
            try:
                value = value()
            except Exception:
                value = None
        if isinstance(value, (list, tuple)):
            return [getattr(t, "value", t) for t in value]
    return []


def _cmd_get(ctx: RemedyContext, flag: str) -> str | None:
    if ctx.command is None:
        return None
    try:
        value = ctx.command.get(flag)
    except Exception:
        return None
    return None if value is None else str(value)


def _is_script(ctx: RemedyContext) -> bool:
    """An offline `LLM(...)` script rather than a server launch."""
    text = str(ctx.facts.get("launch.command") or "")
    if re.search(r"\bpython\d*(\.\d+)?\s+(?!-m\b)\S+\.py\b", text):
        return True
    return any(getattr(m.line, "proc", None) == "MainProcess" for m in ctx.matches if getattr(m, "line", None))


def _script_without_call(ctx: RemedyContext) -> bool:
    """A `python script.py` launch whose LLM(...) call the doctor cannot see: flags cannot be edited in."""
    return _is_script(ctx) and _shape(ctx) != "python"


def _optional_edit(name: str, *args) -> Any | None:
    """An edit type the command model may offer beyond the four in DESIGN.md (None when absent)."""
    cls = getattr(E, name, None)
    return cls(*args) if cls is not None else None


# ---------------------------------------------------------------- cli-unknown-arg

def _split_tokens(text: str) -> list[str]:
    return text.split()


def _group(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """[(flag, [values...]), ...] in order; leading positionals come as ('', [words])."""
    out: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("-") and len(tok) > 1 and not re.fullmatch(r"-\d+(\.\d+)?", tok):
            out.append((tok, []))
        elif out:
            out[-1][1].append(tok)
        else:
            out.append(("", [tok]))
    return out


def _unsplit_tokens(ctx: RemedyContext) -> list[str]:
    """argv elements holding a flag and its value together ("--port 6379").

    The command model splits them while parsing and leaves a note; older shapes keep the raw token.
    """
    found = [t for t in _command_tokens(ctx) if t.startswith("--") and " " in t.strip()]
    for note in getattr(ctx.command, "notes", None) or []:
        m = re.search(r"the single argument (.+?) was split into (.+?) \(", str(note))
        if m:
            found.append(m.group(2))
    return found


def fix_unknown_arg(ctx: RemedyContext) -> Fix | None:
    F = _flags()
    version = _version(ctx)
    names = _pattern_names(ctx)
    if "model-positional" in names and "argparse" not in names:
        return _fix_model_positional(ctx)
    tokens = _split_tokens(ctx.captures.get("tokens", ""))
    edits: list = []
    parts: list[str] = []
    notes: list[str] = []
    alternatives: list[Alternative] = []
    facts_used: dict[str, Any] = {"vllm.version": version or "unknown (newest assumed)"}

    # 1. a flag and its value passed as one argv element
    unsplit = _unsplit_tokens(ctx)
    handled: set[str] = set()
    for tok in unsplit:
        flag, _, value = tok.strip().partition(" ")
        value = value.strip()
        if tok in _command_tokens(ctx):    # still glued in the parsed command: rewrite it
            edits += [RemoveFlag(tok), SetFlag(F.canonical(flag), value or None)]
        parts.append(f"Pass {flag} {value} as two arguments (it was one argument '{tok}')".replace("  ", " "))
        handled.update(tok.split())
    if unsplit:
        notes.append("Each flag and its value must be separate argv elements (a YAML list item '- --port 8000' "
                     "or a subprocess list entry '--port 8000' is ONE element); write them as two items or "
                     "use --flag=value.")

    groups = _group([t for t in tokens if t not in handled] if handled else tokens)

    # 2. launcher words repeated after a docker image whose entrypoint already starts the server
    lead = [w for flag, ws in groups if not flag for w in ws] + [flag for flag, _ in groups if flag == "-m"]
    if lead and (set(lead) & LAUNCH_WORDS or _shape(ctx) in ("docker", "compose")):
        drop = _optional_edit("DropLauncher")
        if drop is not None:
            edits.append(drop)
        words = " ".join(w for w in tokens if w in LAUNCH_WORDS) or " ".join(lead)
        parts.append(f"Remove the duplicated '{words}': the vllm/vllm-openai image's entrypoint already runs the "
                     "server, so everything after the image name must be the model and its flags")
        notes.append("With `docker run IMAGE vllm serve MODEL ...` the container runs `vllm serve vllm serve MODEL`; "
                     "pass only `IMAGE MODEL --flags` (images up to ~0.11 start "
                     "`python3 -m vllm.entrypoints.openai.api_server`: pass `--model MODEL --flags`), or override "
                     "the entrypoint with --entrypoint.")
        groups = [(f, ws) for f, ws in groups if f and f != "-m"]

    # 3. each rejected flag
    for flag, values in groups:
        if not flag:
            continue
        value = " ".join(values) if values else None
        canon = F.canonical(flag)
        if canon == "--task":
            runner, convert = TASK_TO_RUNNER.get((value or "").lower(), ("pooling", value))
            edits.append(RemoveFlag(flag))
            if runner:
                edits.append(SetFlag("--runner", runner))
            if convert:
                edits.append(SetFlag("--convert", convert))
            shown = " ".join(x for x in (runner and f"--runner {runner}", convert and f"--convert {convert}") if x)
            parts.append(f"Use {shown} instead of --task {value or ''}".rstrip() if shown else
                         "Drop --task (the model's default runner applies)")
            notes.append("--task was removed in 0.13.0; --runner {generate,pooling} and --convert "
                         "{embed,classify,reward} replace it (0.10.1+).")
            continue
        if F.is_known(canon, version):
            # argparse knows this option, yet echoed it: it reached the parser glued to its value as
            # ONE argv element ("--dtype auto" in a YAML list or a subprocess list)
            glued = f"{flag} {value}" if value else flag
            parts.append(f"Pass {glued} as separate arguments (it arrived as the single argument '{glued}')")
            if ctx.facts.get("launch.reconstructed") and not _cmd_get(ctx, canon):
                edits.append(SetFlag(canon, value if F.takes_value(canon) else None))
            if not notes or "separate argv elements" not in notes[0]:
                notes.insert(0, "Each flag and its value must be separate argv elements (a YAML list item "
                                "'- --dtype auto' or a subprocess list entry '--port 8000' is ONE element); "
                                "write them as two items or use --flag=value.")
            continue
        new, note = F.replacement(canon, version)
        if new:
            fixed_value = F.replacement_value(canon) or value
            edits += [RemoveFlag(flag), SetFlag(new, fixed_value)]
            parts.append(f"Use {new}{' ' + fixed_value if fixed_value else ''} instead of {flag}")
            if note:
                notes.append(f"{flag}: {note}")
            continue
        if note.startswith("not yet present"):
            edits.append(RemoveFlag(flag))
            first = note.rsplit(" ", 1)[-1]
            parts.append(f"Remove {flag}: it only exists from vLLM {first} on (this is {version})")
            alternatives.append(Alternative(f"Upgrade vLLM to {first} or newer and keep {flag}", [],
                                            "a different vLLM release"))
            continue
        if note:
            edits.append(RemoveFlag(flag))
            parts.append(f"Remove {flag}{' ' + value if value else ''}: {note}")
            continue
        cands = F.suggest(canon, version)
        if cands:
            best = cands[0]
            takes = F.takes_value(best)
            edits += [RemoveFlag(flag), SetFlag(best, value if takes else None)]
            parts.append(f"Use {best}{' ' + value if (value and takes) else ''} instead of {flag}")
            if len(cands) > 1:
                notes.append(f"Other close flags: {', '.join(cands[1:])}.")
            if canon == "--max-seq-len":
                notes.append("--max-seq-len has never been a vLLM flag. On 0.4.3..0.10.2 argparse silently took it "
                             "as --max-seq-len-to-capture (the CUDA-graph capture length), so the context limit was "
                             "NOT applied; --max-model-len sets the context length.")
            continue
        edits.append(RemoveFlag(flag))
        parts.append(f"Remove {flag}: vLLM {version or ''} has no such option".replace("  ", " "))

    if not parts:
        return None
    return Fix("; ".join(parts), edits, alternatives, notes=notes, facts_used=facts_used)


def _fix_model_positional(ctx: RemedyContext) -> Fix:
    model = _cmd_get(ctx, "--model") or ctx.facts.get("args.model")
    edit = _optional_edit("SetModel", model) if model else None
    edits = [edit] if edit is not None else [SetFlag("--model", model)] if model else []
    summary = (f"Give the model as the first positional argument: vllm serve {model} ..." if model else
               "Give the model as the first positional argument: vllm serve <model> ...")
    return Fix(summary, edits, notes=["`vllm serve` takes the model positionally; `--model` alone is refused "
                                      "together with --served-model-name on recent releases."])


# ---------------------------------------------------------------- cli-invalid-choice

def _parse_choices(text: str | None) -> list[str]:
    if not text:
        return []
    text = text.replace(" or ", ", ")
    return [c.strip().strip("'\"") for c in text.split(",") if c.strip()]


def _to_int(value: str) -> str | None:
    v = value.strip().lower()
    if v in NUMBER_WORDS:
        return str(NUMBER_WORDS[v])
    try:
        f = float(v.replace(",", "").replace("_", ""))
    except ValueError:
        return None
    return str(int(f)) if f == int(f) else None


def _to_float(value: str) -> str | None:
    v = value.strip()
    if v.endswith("%"):
        try:
            return f"{float(v[:-1]) / 100:g}"
        except ValueError:
            return None
    try:
        return f"{float(v.replace(',', '.')):g}"
    except ValueError:
        return None


def _flag_for_choices(value: str, choices: list[str]) -> str | None:
    """Which option a pydantic Literal error is about, from its choices."""
    F = _flags()
    for flag in ("--dtype", "--kv-cache-dtype", "--load-format", "--tokenizer-mode", "--distributed-executor-backend",
                 "--quantization", "--runner", "--convert", "--model-impl"):
        known = F.choices(flag) or []
        if known and set(choices) <= set(known) | {"auto"} and len(set(choices) & set(known)) >= 2:
            return flag
    if {"float16", "bfloat16"} <= set(choices):
        return "--dtype"
    return None


def fix_invalid_choice(ctx: RemedyContext) -> Fix | None:
    F = _flags()
    version = _version(ctx)
    names = _pattern_names(ctx)
    name = names[0] if names else ""
    fatal = [m for m in ctx.matches if getattr(m, "kind", "fatal") == "fatal"]
    if fatal:
        name = str(getattr(fatal[0].pattern, "name", name))
    value = (ctx.captures.get("value") or "").strip().strip("'\"")
    flag = ctx.captures.get("flag")
    choices = _parse_choices(ctx.captures.get("choices"))
    new: str | None = None
    notes: list[str] = []
    if name == "pydantic-literal":
        flag = _flag_for_choices(value, choices)
    if name == "pydantic-bound":
        bound = ctx.captures.get("bound")
        flag = None
        for fact, opt in (("args.gpu_memory_utilization", "--gpu-memory-utilization"),):
            if str(ctx.facts.get(fact)) == value:
                flag = opt
        if flag is None and bound in ("1", "1.0") and "less than" in ctx.captures.get("constraint", ""):
            flag = "--gpu-memory-utilization"
        if flag == "--gpu-memory-utilization":
            try:
                v = float(value)
                new = f"{v / 100:g}" if 1 < v <= 100 else "0.9"
            except ValueError:
                new = "0.9"
            notes.append("--gpu-memory-utilization is a fraction of the GPU's total memory (0 < u <= 1).")
    if flag is None:
        return Fix(f"Use one of the accepted values instead of {value!r}: {', '.join(choices)}"
                   if choices else f"{value!r} is not an accepted value", [], notes=notes)
    canon = F.canonical(flag)
    if new is None:
        if name == "int":
            new = _to_int(value)
        elif name == "float":
            new = _to_float(value)
        else:
            new = F.normalize_choice(canon, value)
            valid = choices or F.choices(canon, version) or []
            if new is not None and valid and new not in valid:
                new = next((c for c in valid if c.lower() == new.lower()), None)
            if new is None and valid:
                close = difflib.get_close_matches(value.lower(), [c.lower() for c in valid], n=1, cutoff=0.6)
                new = next((c for c in valid if close and c.lower() == close[0]), None)
    if new is None:
        shown = f": {', '.join(choices)}" if choices else ""
        return Fix(f"Pass an accepted value to {canon}{shown} (got {value!r})", [], notes=notes)
    summary = f"Use {canon} {new} instead of {canon} {value}"
    if _is_script(ctx) or name.startswith("pydantic"):
        key = canon[2:].replace("-", "_")
        summary += f" ({key}={new!r} in LLM(...))"
    if canon == "--dtype":
        notes.append("--dtype accepts auto, half, float16, bfloat16, float, float32; torch.float16, fp16 and bf16 "
                     "are not vLLM spellings.")
    edits = [] if _script_without_call(ctx) else [SetFlag(canon, new)]
    return Fix(summary, edits, notes=notes,
               facts_used={"vllm.version": version or "unknown (newest assumed)"})


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
    close = difflib.get_close_matches(base, entries, n=3, cutoff=0.6)
    if not close:
        close = [e for e in entries if e.lower() == base.lower()]
    return [os.path.join(parent, c) for c in close]


def _docker_mounts(ctx: RemedyContext) -> list[str]:
    text = str(ctx.facts.get("launch.command") or "")
    return re.findall(r"(?:-v|--volume)[ =]\S+?:(/[^\s:]+)", text)


def fix_model_not_found(ctx: RemedyContext) -> Fix | None:
    names = set(_pattern_names(ctx))
    model = (ctx.captures.get("model") or _cmd_get(ctx, "--model") or ctx.facts.get("args.model") or "").strip()
    model = model.rstrip(".")
    shown = model or "the model"
    notes: list[str] = []
    if names & {"gated", "gated-url", "gated-oserror"}:
        repo = model or "the repository"
        return Fix(f"Authenticate for the gated repo {repo}: accept its licence on https://huggingface.co/{repo} "
                   f"with your account, then `huggingface-cli login` or set HF_TOKEN",
                   [SetEnv("HF_TOKEN", "<your-hf-token>")],
                   notes=["The token must belong to an account that was granted access to the gated model; a token "
                          "alone is not enough (403 = authenticated but not on the access list, 401 = no/invalid "
                          "token). In docker pass it with -e HF_TOKEN=..."],
                   facts_used={"model": model})
    offline = names & {"offline", "offline-cache", "offline-mode"}
    env_offline = str((ctx.facts.get("env.vars") or {}).get("HF_HUB_OFFLINE", "")) if isinstance(
        ctx.facts.get("env.vars"), dict) else ""
    text = str(ctx.facts.get("launch.command") or "")
    try:
        cmd_env = ctx.command.env if ctx.command is not None else {}
    except Exception:  # noqa: BLE001 - a command model without env
        cmd_env = {}
    repo_like = bool(model) and "/" in str(model) and not str(model).startswith(("/", ".", "~"))
    if not offline and repo_like and "1" in (cmd_env.get("HF_HUB_OFFLINE"), cmd_env.get("TRANSFORMERS_OFFLINE")):
        offline = {"offline-mode"}   # "invalid repository" for a repo id while offline: it is not cached
    if offline:
        if "HF_HUB_OFFLINE=1" in text or env_offline == "1" or names & {"offline-cache", "offline-mode"}:
            return Fix(f"Set HF_HUB_OFFLINE=0 so {shown} can be downloaded, or download it first "
                       f"(`huggingface-cli download {model or 'REPO'}`) and serve the local path",
                       [SetEnv("HF_HUB_OFFLINE", "0")],
                       alternatives=[Alternative(f"Keep offline mode: run `huggingface-cli download {model or 'REPO'}` "
                                                 "on a machine with network access and copy the cache "
                                                 "(~/.cache/huggingface) or serve the downloaded directory", [],
                                                 "a manual download")],
                       notes=["Offline mode (HF_HUB_OFFLINE=1 / TRANSFORMERS_OFFLINE=1) only works for files already "
                              "in the local Hugging Face cache."], facts_used={"model": model})
        return Fix(f"The Hugging Face hub could not be reached: check network/proxy (HTTPS_PROXY, HF_ENDPOINT) or "
                   f"download {shown} beforehand and serve the local directory", [], facts_used={"model": model})
    if model and _looks_local(model):
        near = _near_dirs(model)
        mounts = _docker_mounts(ctx)
        if near:
            return Fix(f"Use --model {near[0]}: {model} does not exist, a directory with a close name does",
                       [SetFlag("--model", near[0])],
                       alternatives=[Alternative(f"Use {p}", [SetFlag("--model", p)]) for p in near[1:]],
                       facts_used={"model": model, "nearby": near})
        if mounts and not any(model == m or model.startswith(m.rstrip("/") + "/") for m in mounts):
            notes.append(f"The container only mounts {', '.join(mounts)}; {model} is not under any of them. Mount the "
                         f"host directory there (-v /host/dir:{model}) or point --model into a mounted path.")
        return Fix(f"Check the model path {model}: it must be an existing directory (inside the container, when one "
                   f"is used) containing config.json (params.json for Mistral-format models)", [], notes=notes,
                   facts_used={"model": model})
    if "no-config" in names:
        return Fix(f"{shown} has no config.json/params.json: point --model at the directory that holds them", [],
                   facts_used={"model": model})
    return Fix(f"Check the repository id {shown}: it does not exist on huggingface.co or is private (log in with "
               f"`huggingface-cli login` / HF_TOKEN if it is yours)", [], notes=notes, facts_used={"model": model})


# ---------------------------------------------------------------- arch-unsupported

def fix_arch_unsupported(ctx: RemedyContext) -> Fix | None:
    F = _flags()
    version = _version(ctx)
    names = set(_pattern_names(ctx))
    arch = ctx.captures.get("archs") or ctx.captures.get("arch") or "this architecture"
    if "inspect-failed" in names:
        return Fix(f"{arch} IS supported by this vLLM: importing its model code failed. Fix the installation (the "
                   f"import error printed before, e.g. a vLLM build that does not match torch/CUDA) and rerun the "
                   f"same command", [],
                   notes=["`failed to be inspected` is not an unsupported model: vLLM's registry subprocess could not "
                          "import the model module. Reinstall vLLM with its pinned torch (pip install -U vllm in a "
                          "fresh venv) or use the official image."],
                   facts_used={"vllm.version": version or "unknown"})
    has_impl = bool(version) and F.is_known("--model-impl", version) or (not version and F.is_known("--model-impl"))
    upgrade = Alternative(f"Upgrade vLLM to a release that implements {arch} (pip install -U vllm, or a newer "
                          f"vllm/vllm-openai image)", [], "a different vLLM release")
    if "no-module" in names or not has_impl:
        why = ("the Transformers backend was tried and has no model class for it either"
               if "no-module" in names else f"vLLM {version} has no --model-impl (0.7.2+)")
        return Fix(f"Upgrade vLLM: {arch} is not implemented in {version or 'this version'} ({why})", [],
                   notes=["Custom models can also be registered as an out-of-tree plugin."],
                   facts_used={"vllm.version": version or "unknown"})
    return Fix(f"Try --model-impl transformers (the Transformers backend) or upgrade vLLM: {arch} has no native "
               f"implementation in {version or 'this version'}",
               [SetFlag("--model-impl", "transformers")], alternatives=[upgrade],
               notes=["The Transformers backend works for models transformers implements; it can be slower than a "
                      "native vLLM implementation."],
               facts_used={"vllm.version": version or "unknown"})


# ---------------------------------------------------------------- transformers-too-old

def fix_transformers_too_old(ctx: RemedyContext) -> Fix | None:
    model_type = ctx.captures.get("model_type")
    versions = ctx.facts.get("env.versions") or {}
    installed = versions.get("transformers") if isinstance(versions, dict) else None
    what = f"model type '{model_type}'" if model_type else "the checkpoint's model type"
    have = f" (installed: transformers {installed})" if installed else ""
    return Fix(f"Upgrade transformers: pip install -U transformers{have} does not know {what}; then run the same "
               f"command", [],
               alternatives=[Alternative("For a model newer than the latest transformers release: pip install "
                                         "git+https://github.com/huggingface/transformers.git", [],
                                         "an unreleased transformers")],
               notes=["If the installed vLLM pins an older transformers, upgrade vLLM as well (a newer vLLM also "
                      "brings the model implementation)."],
               facts_used={"transformers": installed or "unknown", "model_type": model_type or "unknown"})


# ---------------------------------------------------------------- trust-remote-code

def fix_trust_remote_code(ctx: RemedyContext) -> Fix | None:
    model = ctx.captures.get("model") or ctx.facts.get("args.model") or "the model repository"
    summary = "Add --trust-remote-code"
    if _is_script(ctx):
        summary += " (trust_remote_code=True in LLM(...))"
    summary += f" after reading the Python files of {model}"
    edits = [] if _script_without_call(ctx) else [SetFlag("--trust-remote-code")]
    return Fix(summary, edits,
               notes=["--trust-remote-code runs the repository's .py files with your privileges: read them first "
                      "and pin a --revision (--code-revision) you reviewed."],
               facts_used={"model": model})


# ---------------------------------------------------------------- port-in-use

def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_port_after(port: int, live: bool, gap: int = 1) -> int:
    """`port + gap`, or when the doctor runs on the machine itself the first free port from there."""
    if live:
        for cand in range(port + gap, min(port + gap + 50, 65536)):
            if _port_free(cand):
                return cand
    return port + gap


def _port_socket(ctx: RemedyContext) -> str:
    """Which socket failed: the HTTP server's (errno/uvicorn), torch.distributed's TCPStore, or ZMQ."""
    names = pattern_names(ctx)
    if names & {"tcpstore", "tcpstore-bind"}:
        return "tcpstore"
    return "zmq" if "zmq" in names else "http"


def fix_port_in_use(ctx: RemedyContext) -> Fix | None:
    live = bool(ctx.facts.get("doctor.live") or ctx.facts.get("env.live"))
    kind = _port_socket(ctx)
    if kind != "http":
        return _fix_internal_port(ctx, kind, live)
    port = ctx.capture_int("port") or ctx.fact_int("args.port")
    if port is None:
        got = _cmd_get(ctx, "--port")
        port = int(got) if got and got.isdigit() else 8000
    new = _free_port_after(port, live)
    owner = ctx.facts.get(f"env.port_owner.{port}") or ctx.facts.get("env.port_owner")
    held = f" is held by {owner}" if owner else " is taken"
    return Fix(f"Use --port {new}: port {port}{held}", [SetFlag("--port", str(new))],
               alternatives=[Alternative(f"Stop the process listening on port {port} (`ss -ltnp 'sport = :{port}'` or "
                                         f"`lsof -i :{port}`) and keep --port {port}", [], "stopping another service")],
               notes=["Clients and any -p host:container mapping must use the new port."],
               facts_used={"port": port, "new_port": new, "checked_free_here": live})


def _fix_internal_port(ctx: RemedyContext, kind: str, live: bool) -> Fix:
    """A port vLLM or torch binds for itself (rule explanation, cases 2 and 3): never `--port`."""
    port = ctx.capture_int("port")
    where = f"port {port}" if port else "the port"
    http = _cmd_get(ctx, "--port") or ctx.facts.get("args.port")
    stop = Alternative(f"Stop the process that holds {where}"
                       + (f" (`ss -ltnp 'sport = :{port}'`)" if port else " (`ss -ltnp`)")
                       + ": often an earlier vLLM or torchrun that did not exit", [], "stopping that process")
    facts_used = {"port": port, "http_port": http, "checked_free_here": live}
    notes = [f"--port{f' {http}' if http else ''} is the HTTP port and is not the one that clashed: leave it."]
    if kind == "zmq":
        facts_used["socket"] = "vLLM ZMQ messaging"
        rpc = _cmd_get(ctx, "--data-parallel-rpc-port")
        dp = ctx.fact_int("args.data_parallel_size") or as_int(_cmd_get(ctx, "--data-parallel-size")) or 1
        if port and (str(port) == rpc or (rpc is None and port == 29550 and dp > 1)):
            new = _free_port_after(port, live)
            return Fix(f"Use --data-parallel-rpc-port {new}: the data-parallel handshake port {port} is taken",
                       [SetFlag("--data-parallel-rpc-port", str(new))], alternatives=[stop],
                       notes=notes + ["Every node of the deployment must be given the same --data-parallel-rpc-port."],
                       facts_used=facts_used)
        rpc_env = env_value(ctx, "VLLM_RPC_PORT")
        if port and rpc_env == str(port):
            new = _free_port_after(port, live)
            return Fix(f"Set VLLM_RPC_PORT={new}: the RPC port {port} is taken", [SetEnv("VLLM_RPC_PORT", str(new))],
                       alternatives=[stop], notes=notes, facts_used=facts_used)
        return Fix(stop.summary, [], notes=notes, facts_used=facts_used)
    facts_used["socket"] = "torch.distributed init (TCPStore)"
    nnodes = ctx.fact_int("args.nnodes") or as_int(_cmd_get(ctx, "--nnodes")) or 1
    backend = _cmd_get(ctx, "--distributed-executor-backend") or ctx.facts.get("args.distributed_executor_backend")
    if nnodes > 1:
        new = _free_port_after(port or 29501, live)
        return Fix(f"Use --master-port {new} on every node: the distributed init port {where} is taken",
                   [SetFlag("--master-port", str(new))], alternatives=[stop], notes=notes, facts_used=facts_used)
    if backend == "external_launcher":
        new = _free_port_after(port or 29500, live)
        return Fix(f"Set MASTER_PORT={new} for torchrun: the distributed init port {where} is taken",
                   [SetEnv("MASTER_PORT", str(new))], alternatives=[stop], notes=notes, facts_used=facts_used)
    # One node: vLLM picked the port itself (VLLM_PORT and upwards when set), and another instance starting
    # at the same moment, or a leftover process, took it before torch bound it.
    base = as_int(env_value(ctx, "VLLM_PORT"))
    new = _free_port_after(base if base is not None else (port or 29500), live, gap=100)
    facts_used["VLLM_PORT"] = base
    why = (f"VLLM_PORT={base} is shared with another instance" if base is not None
           else "another instance starting at the same time, or a leftover process, took the port vLLM picked")
    return Fix(f"Set VLLM_PORT={new} for this instance: {where} for torch.distributed was taken ({why})",
               [SetEnv("VLLM_PORT", str(new))], alternatives=[stop],
               notes=notes + ["Start several instances one after another, or give each its own VLLM_PORT a few dozen "
                              "ports apart: vLLM takes its internal ports from VLLM_PORT upwards."],
               facts_used=facts_used)


# ---------------------------------------------------------------- cuda-fork

def fix_cuda_fork(ctx: RemedyContext) -> Fix | None:
    return Fix("Set VLLM_WORKER_MULTIPROC_METHOD=spawn", [SetEnv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")],
               notes=["With spawn, a script's top level runs again in every worker: keep LLM(...) under "
                      "`if __name__ == \"__main__\":` and avoid touching CUDA (torch.cuda.*) before vLLM starts."])
