"""Remedies for configuration and CLI errors (rules/cli-*.toml, arch-unsupported, trust-remote-code, cuda-fork).
A missing model and an old transformers are remedies/model.py's, a taken port remedies/ports.py's.

Every edit goes through the command model (vllm_doctor.command); flag knowledge (renames, removals,
did-you-mean, choices) comes from vllm_doctor.command.flags at the vLLM version the log shows.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from vllm_doctor.command.edits import DropLauncher, RemoveFlag, SetEnv, SetFlag, SetModel
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext

PY_SCRIPT = re.compile(r"\bpython\d*(\.\d+)?\s+(?!-m\b)\S+\.py\b")
LAUNCH_WORDS = {"vllm", "serve", "python", "python3", "-m", "vllm.entrypoints.openai.api_server",
                "vllm.entrypoints.api_server", "vllm.entrypoints.cli.main"}
NUMBER_WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9, "ten": 10, "sixteen": 16, "thirty-two": 32}
# values of the removed --task and what replaced them (vllm-flags-history.md: --runner/--convert, 0.10.1+)
TASK_TO_RUNNER = {"embed": ("pooling", "embed"), "embedding": ("pooling", "embed"),
                  "classify": ("pooling", "classify"), "score": ("pooling", "classify"),
                  "reward": ("pooling", "reward"), "generate": ("generate", None), "auto": (None, None)}
GLUED_NOTE = ("Each flag and its value must be separate argv elements (a YAML list item '- {}' or a subprocess "
              "list entry '--port 8000' is ONE element); write them as two items or use --flag=value.")


def _flags():
    from vllm_doctor.command import flags
    return flags


# ---------------------------------------------------------------- helpers

def _is_script(ctx: RemedyContext) -> bool:
    """An offline `LLM(...)` script rather than a server launch."""
    return (bool(PY_SCRIPT.search(str(ctx.fact("launch.command") or "")))
            or any(m.line.proc == "MainProcess" for m in ctx.matches))


# ---------------------------------------------------------------- cli-unknown-arg

@dataclass
class _Plan:
    """The fix for an argparse rejection, built step by step."""
    edits: list = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)


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


def _plan_unsplit(ctx: RemedyContext, plan: _Plan) -> set[str]:
    """Step 1: a flag and its value passed as one argv element ("--port 6379"); the command model splits them
    while parsing and leaves a note, older shapes keep the raw token. Returns the words it accounts for."""
    argv = ctx.command.argv() if ctx.command is not None else []
    notes = ctx.command.notes if ctx.command is not None else []
    unsplit = [t for t in argv if t.startswith("--") and " " in t.strip()]
    unsplit += [m.group(2) for m in (re.search(r"the single argument (.+?) was split into (.+?) \(", str(n))
                                     for n in notes) if m]
    handled: set[str] = set()
    for tok in unsplit:
        flag, _, value = tok.strip().partition(" ")
        value = value.strip()
        if tok in argv:    # still glued in the parsed command: rewrite it
            plan.edits += [RemoveFlag(tok), SetFlag(_flags().canonical(flag), value or None)]
        plan.parts.append(f"Pass {flag} {value} as two arguments (it was one argument '{tok}')".replace("  ", " "))
        handled.update(tok.split())
    if unsplit:
        plan.notes.append(GLUED_NOTE.format("--port 8000"))
    return handled


def _plan_launcher(ctx: RemedyContext, plan: _Plan, tokens: list[str], groups: list) -> list:
    """Step 2: launcher words repeated after a docker image whose entrypoint already starts the server."""
    lead = [w for flag, ws in groups if not flag for w in ws] + [flag for flag, _ in groups if flag == "-m"]
    if not lead or not (set(lead) & LAUNCH_WORDS or ctx.is_docker):
        return groups
    plan.edits.append(DropLauncher())
    words = " ".join(w for w in tokens if w in LAUNCH_WORDS) or " ".join(lead)
    plan.parts.append(f"Remove the duplicated '{words}': the vllm/vllm-openai image's entrypoint already runs the "
                      "server, so everything after the image name must be the model and its flags")
    plan.notes.append("With `docker run IMAGE vllm serve MODEL ...` the container runs `vllm serve vllm serve MODEL`; "
                      "pass only `IMAGE MODEL --flags` (images up to ~0.11 start "
                      "`python3 -m vllm.entrypoints.openai.api_server`: pass `--model MODEL --flags`), or override "
                      "the entrypoint with --entrypoint.")
    return [(f, ws) for f, ws in groups if f and f != "-m"]


def _plan_task(plan: _Plan, flag: str, value: str | None) -> None:
    runner, convert = TASK_TO_RUNNER.get((value or "").lower(), ("pooling", value))
    plan.edits.append(RemoveFlag(flag))
    if runner:
        plan.edits.append(SetFlag("--runner", runner))
    if convert:
        plan.edits.append(SetFlag("--convert", convert))
    shown = " ".join(x for x in (runner and f"--runner {runner}", convert and f"--convert {convert}") if x)
    plan.parts.append(f"Use {shown} instead of --task {value or ''}".rstrip() if shown else
                      "Drop --task (the model's default runner applies)")
    plan.notes.append("--task was removed in 0.13.0; --runner {generate,pooling} and --convert "
                      "{embed,classify,reward} replace it (0.10.1+).")


def _plan_known(ctx: RemedyContext, plan: _Plan, flag: str, canon: str, value: str | None) -> None:
    """argparse knows this option, yet echoed it: it reached the parser glued to its value as ONE argv
    element ("--dtype auto" in a YAML list or a subprocess list)."""
    glued = f"{flag} {value}" if value else flag
    plan.parts.append(f"Pass {glued} as separate arguments (it arrived as the single argument '{glued}')")
    if ctx.fact("launch.reconstructed") and ctx.flag(canon) in (None, ""):
        plan.edits.append(SetFlag(canon, value if _flags().takes_value(canon) else None))
    if not plan.notes or "separate argv elements" not in plan.notes[0]:
        plan.notes.insert(0, GLUED_NOTE.format("--dtype auto"))


def _installed_options(ctx: RemedyContext) -> set[str]:
    """The options the installed parser listed in the `usage:` it printed (events/logfacts.py), if the log has one."""
    return set(ctx.fact("log.usage_flags") or ())


def _not_in_usage(ctx: RemedyContext, canon: str) -> bool:
    """The `usage:` the installed parser printed lists none of this option's spellings: that vLLM lacks it (the
    usual reason a flag newer releases know is refused when the log shows no version)."""
    usage = _installed_options(ctx)
    full = _flags().resolve(canon, ctx.launch_version) or canon     # an abbreviation names its option
    return bool(usage) and not usage & set(_flags().option_strings(full))


def _plan_older_install(plan: _Plan, flag: str, canon: str, value: str | None) -> None:
    F = _flags()
    first = F.first_release(canon)
    since = f"; it first appears in vLLM {first}" if first else ""
    env = F.env_var_for(flag) or next((n for n in (F.env_var_for(flag, "0.0.1"),) if n), None)
    plan.edits.append(RemoveFlag(flag))
    if env:
        plan.edits.append(SetEnv(env, value or "1"))
        plan.parts.append(f"Set {env}={value or '1'} instead of {flag}: the installed vLLM has no {flag} (the usage "
                          f"it printed lists no such option{since})")
    else:
        plan.parts.append(f"Remove {flag}{' ' + value if value else ''}: the installed vLLM does not have it (the "
                          f"usage it printed lists no such option{since})")
    if first:
        plan.alternatives.append(Alternative(f"Upgrade vLLM to {first} or newer and keep {flag}", [],
                                             "a different vLLM release"))


def _plan_flag(ctx: RemedyContext, plan: _Plan, version: str | None, flag: str, value: str | None) -> None:
    """Step 3, for each rejected flag: renamed, removed, not yet added, misspelt, or unknown."""
    F = _flags()
    canon = F.canonical(flag)
    if canon == "--task":
        return _plan_task(plan, flag, value)
    if F.is_known(canon, version):
        if _not_in_usage(ctx, canon):
            return _plan_older_install(plan, flag, canon, value)
        return _plan_known(ctx, plan, flag, canon, value)
    new, note = F.replacement(canon, version)
    if new:
        fixed_value = F.replacement_value(canon) or value
        plan.edits += [RemoveFlag(flag), SetFlag(new, fixed_value)]
        plan.parts.append(f"Use {new}{' ' + fixed_value if fixed_value else ''} instead of {flag}")
        plan.notes += [f"{flag}: {note}"] if note else []
        return None
    if note.startswith("not yet present"):
        first = note.rsplit(" ", 1)[-1]
        plan.edits.append(RemoveFlag(flag))
        plan.parts.append(f"Remove {flag}: it only exists from vLLM {first} on (this is {version})")
        plan.alternatives.append(Alternative(f"Upgrade vLLM to {first} or newer and keep {flag}", [],
                                             "a different vLLM release"))
        return None
    if note:
        plan.edits.append(RemoveFlag(flag))
        plan.parts.append(f"Remove {flag}{' ' + value if value else ''}: {note}")
        return None
    env = F.env_var_for(flag, version)
    if env:              # an environment variable given as a flag: vLLM reads it from the environment only
        plan.edits += [RemoveFlag(flag), SetEnv(env, value or "1")]
        plan.parts.append(f"Set {env}={value or '1'} instead of {flag}: it is an environment variable, not a flag")
        return None
    cands = F.suggest(canon, version)
    usage = _installed_options(ctx)
    if usage:                    # the installed parser's own list beats the newest release's
        cands = [c for c in cands if set(F.option_strings(c)) & usage]
    if not cands:
        plan.edits.append(RemoveFlag(flag))
        plan.parts.append(f"Remove {flag}: vLLM {version or ''} has no such option".replace("  ", " "))
        return None
    best, takes = cands[0], F.takes_value(cands[0])
    plan.edits += [RemoveFlag(flag), SetFlag(best, value if takes else None)]
    plan.parts.append(f"Use {best}{' ' + value if (value and takes) else ''} instead of {flag}")
    plan.notes += [f"Other close flags: {', '.join(cands[1:])}."] if len(cands) > 1 else []
    if canon == "--max-seq-len":
        plan.notes.append("--max-seq-len has never been a vLLM flag. On 0.4.3..0.10.2 argparse silently took it "
                          "as --max-seq-len-to-capture (the CUDA-graph capture length), so the context limit was "
                          "NOT applied; --max-model-len sets the context length.")
    return None


def fix_unknown_arg(ctx: RemedyContext) -> Fix | None:
    if ctx.has_pattern("model-positional") and not ctx.has_pattern("argparse"):
        return _fix_model_positional(ctx)
    version = ctx.launch_version
    plan = _Plan()
    tokens = (ctx.capture("tokens") or "").split()
    handled = _plan_unsplit(ctx, plan)
    groups = _plan_launcher(ctx, plan, tokens, _group([t for t in tokens if t not in handled]))
    for flag, values in groups:
        if flag:
            _plan_flag(ctx, plan, version, flag, " ".join(values) if values else None)
    if not plan.parts:
        return None
    return Fix("; ".join(plan.parts), plan.edits, plan.alternatives, notes=plan.notes,
               facts_used={"vllm.version": version or "unknown (newest assumed)"})


def _fix_model_positional(ctx: RemedyContext) -> Fix:
    model = ctx.arg("model")
    return Fix(f"Give the model as the first positional argument: vllm serve {model or '<model>'} ...",
               [SetModel(model)] if model else [],
               notes=["`vllm serve` takes the model positionally; `--model` alone is refused "
                      "together with --served-model-name on recent releases."])


# ---------------------------------------------------------------- cli-invalid-choice

def _parse_choices(text: str | None) -> list[str]:
    if not text:
        return []
    text = text.replace(" or ", ", ")
    return [c.strip().strip("'\"") for c in text.split(",") if c.strip()]


def _as_number(value: str, integer: bool) -> str | None:
    """The number a rejected int/float value spells: 'two' -> 2, '1_000' -> 1000, '90%' -> 0.9, '0,9' -> 0.9."""
    v = value.strip().lower()
    if integer and v in NUMBER_WORDS:
        return str(NUMBER_WORDS[v])
    percent = not integer and v.endswith("%")
    text = v[:-1] if percent else v
    try:
        f = float(text.replace(",", "").replace("_", "") if integer else text.replace(",", "."))
        f = f / 100 if percent else f
    except ValueError:
        return None
    if integer:
        return str(int(f)) if f == int(f) else None
    return f"{f:g}"


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


def _bound_flag(ctx: RemedyContext, value: str) -> tuple[str | None, str | None]:
    """A pydantic bound error (`Input should be less than or equal to 1`): the option and the value it needs."""
    flag = "--gpu-memory-utilization" if str(ctx.fact("args.gpu_memory_utilization")) == value else None
    if flag is None and ctx.capture("bound") in ("1", "1.0") and "less than" in (ctx.capture("constraint") or ""):
        flag = "--gpu-memory-utilization"
    if flag is None:
        return None, None
    try:
        v = float(value)
        return flag, f"{v / 100:g}" if 1 < v <= 100 else "0.9"
    except ValueError:
        return flag, "0.9"


def _accepted_value(canon: str, value: str, choices: list[str], version: str | None) -> str | None:
    """The accepted spelling closest to a rejected choice (torch.float16 -> float16, bf16 -> bfloat16)."""
    F = _flags()
    new = F.normalize_choice(canon, value)
    valid = choices or F.choices(canon, version) or []
    if new is not None and valid and new not in valid:
        new = next((c for c in valid if c.lower() == new.lower()), None)
    if new is None and valid:
        close = difflib.get_close_matches(value.lower(), [c.lower() for c in valid], n=1, cutoff=0.6)
        new = next((c for c in valid if close and c.lower() == close[0]), None)
    return new


# what a well-formed value of the JSON-typed flags looks like (vLLM's docs)
JSON_CONFIG_EXAMPLES = {"--compilation-config": "'{\"level\": 3}'",
                        "--kv-transfer-config": "'{\"kv_connector\": \"...\", \"kv_role\": \"kv_both\"}'",
                        "--speculative-config": "'{\"method\": \"ngram\", \"num_speculative_tokens\": 5}'"}


def fix_invalid_choice(ctx: RemedyContext) -> Fix | None:
    version = ctx.launch_version
    fatal = [m for m in ctx.matches if m.kind == "fatal"] or ctx.matches
    name = fatal[0].pattern.name if fatal else ""
    value = (ctx.capture("value") or "").strip().strip("'\"")
    flag = ctx.capture("flag")
    choices = _parse_choices(ctx.capture("choices"))
    new: str | None = None
    notes: list[str] = []
    if name == "port-range":
        return Fix("Use a port from 1024 to 65535 (e.g. --port 8000): the API server refuses privileged and "
                   "out-of-range ports", [SetFlag("--port", "8000")], facts_used={"vllm.version": version or "unknown"})
    if name == "json-config":
        example = JSON_CONFIG_EXAMPLES.get(flag or "", "'{\"key\": value}'")
        return Fix(f"Pass {flag} a JSON object this vLLM accepts, in single quotes (e.g. {flag} {example}); "
                   f"{ctx.capture('detail') or 'the value given'} means its value (or one of its keys) was not accepted: "
                   f"`vllm serve --help={(flag or '--').lstrip('-')}` lists the fields", [],
                   facts_used={"vllm.version": version or "unknown"})
    if name == "parser-choice":       # the API server's own check of the parser names
        flag = "--tool-call-parser" if ctx.capture("parser") == "tool call" else "--reasoning-parser"
        notes.append("A parser a model's guide names may be newer than this vLLM: the list above is what this "
                     "release registers (upgrading vLLM adds the newer ones).")
    if name == "moe-backend":         # the kernel oracle of one quantization: leaving it to vLLM is the fix
        return Fix(f"Drop --moe-backend {value} (vLLM then picks a kernel {ctx.capture('moe_kind')} MoE has), or "
                   f"pass one of: {', '.join(choices)}", [RemoveFlag("--moe-backend")],
                   arithmetic=[f"{ctx.capture('moe_kind')} MoE has no {value!r} kernel"],
                   facts_used={"vllm.version": version or "unknown"})
    if name == "pydantic-literal":
        flag = _flag_for_choices(value, choices)
    if name == "pydantic-bound":
        flag, new = _bound_flag(ctx, value)
        if flag:
            notes.append("--gpu-memory-utilization is a fraction of the GPU's total memory (0 < u <= 1).")
    if flag is None:
        return Fix(f"Use one of the accepted values instead of {value!r}: {', '.join(choices)}"
                   if choices else f"{value!r} is not an accepted value", [], notes=notes)
    canon = _flags().canonical(flag)
    if new is None:
        new = (_as_number(value, name == "int") if name in ("int", "float")
               else _accepted_value(canon, value, choices, version))
    if new is None:
        shown = f": {', '.join(choices)}" if choices else ""
        return Fix(f"Pass an accepted value to {canon}{shown} (got {value!r})", [], notes=notes)
    summary = f"Use {canon} {new} instead of {canon} {value}"
    if _is_script(ctx) or name.startswith("pydantic"):
        summary += f" ({canon[2:].replace('-', '_')}={new!r} in LLM(...))"
    if canon == "--dtype":
        notes.append("--dtype accepts auto, half, float16, bfloat16, float, float32; torch.float16, fp16 and bf16 "
                     "are not vLLM spellings.")
    edits = [SetFlag(canon, new)]     # remedies/shape.py writes it as the script's edit when it is one
    said = [f"{canon} {value!r} is none of its {len(choices)} accepted values: {', '.join(choices)}"] if choices else []
    return Fix(summary, edits, notes=notes, facts_used={"vllm.version": version or "unknown (newest assumed)"},
               arithmetic=said)


# ---------------------------------------------------------------- arch-unsupported

def fix_arch_unsupported(ctx: RemedyContext) -> Fix | None:
    F = _flags()
    version = ctx.launch_version
    arch = ctx.capture("archs") or ctx.capture("arch") or "this architecture"
    has_impl = bool(version) and F.is_known("--model-impl", version) or (not version and F.is_known("--model-impl"))
    upgrade = Alternative(f"Upgrade vLLM to a release that implements {arch} (pip install -U vllm, or a newer "
                          f"vllm/vllm-openai image)", [], "a different vLLM release")
    if ctx.has_pattern("gguf-arch"):
        # transformers reads the .gguf file's config for vLLM: its GGUF mapping lacks the architecture
        return Fix(f"Serve the original checkpoint (safetensors) instead of the GGUF file, or a transformers release "
                   f"whose GGUF reader maps '{arch}' (pip install -U transformers): the installed one cannot read "
                   f"this GGUF's config", [],
                   notes=["vLLM reads a GGUF file's configuration through transformers' GGUF support, which lists "
                          "the architectures it can map; --model-impl does not change that reader."],
                   facts_used={"gguf_architecture": arch})
    headless = _headless_base(arch)
    if headless:
        return Fix(f"Check config.json's `architectures`: {arch} is a base class without its head, which vLLM "
                   f"implements only for embedding models; a generating checkpoint names {arch[:-5]}ForCausalLM or "
                   f"{arch[:-5]}ForConditionalGeneration there", [], alternatives=[upgrade], notes=headless,
                   facts_used={"vllm.version": version or "unknown"})
    if ctx.has_pattern("no-module", "transformers-incompatible") or not has_impl:
        why = ("the Transformers backend was tried and has no model class for it either"
               if ctx.has_pattern("no-module") else
               "the Transformers backend was tried and its implementation does not run in vLLM"
               if ctx.has_pattern("transformers-incompatible") else f"vLLM {version} has no --model-impl (0.7.2+)")
        return Fix(f"Upgrade vLLM: {arch} is not implemented in {version or 'this version'} ({why})", [],
                   notes=["Custom models can also be registered as an out-of-tree plugin."],
                   facts_used={"vllm.version": version or "unknown"})
    return Fix(f"Try --model-impl transformers (the Transformers backend) or upgrade vLLM: {arch} has no native "
               f"implementation in {version or 'this version'}",
               [SetFlag("--model-impl", "transformers")], alternatives=[upgrade],
               notes=["The Transformers backend works for models transformers implements; it can be slower than a "
                      "native vLLM implementation."],
               facts_used={"vllm.version": version or "unknown"})


# ---------------------------------------------------------------- trust-remote-code

def fix_trust_remote_code(ctx: RemedyContext) -> Fix | None:
    model = ctx.capture("model") or ctx.fact("args.model") or "the model repository"
    summary = ("Add --trust-remote-code" + (" (trust_remote_code=True in LLM(...))" if _is_script(ctx) else "")
               + f" after reading the Python files of {model}")
    edits = [SetFlag("--trust-remote-code")]
    return Fix(summary, edits,
               notes=["--trust-remote-code runs the repository's .py files with your privileges: read them first "
                      "and pin a --revision (--code-revision) you reviewed."],
               facts_used={"model": model})


# ---------------------------------------------------------------- cuda-fork

def fix_cuda_fork(ctx: RemedyContext) -> Fix | None:
    return Fix("Set VLLM_WORKER_MULTIPROC_METHOD=spawn", [SetEnv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")],
               notes=["With spawn, a script's top level runs again in every worker: keep LLM(...) under "
                      "`if __name__ == \"__main__\":` and avoid touching CUDA (torch.cuda.*) before vLLM starts."])


def _headless_base(arch: str) -> list[str]:
    """transformers names a model's class without its head `XModel` (Qwen2VLModel) and the generating one
    `XForCausalLM` / `XForConditionalGeneration`; a checkpoint saved from the base class (AutoModel, some
    fine-tuning tools) lists the headless one in config.json, which vLLM implements only for embedding models."""
    if not re.fullmatch(r"[A-Z]\w{0,60}Model", arch or "") or "For" in arch:
        return []
    return [f"A checkpoint saved from the base class (AutoModel, some fine-tuning tools) lists {arch}; set the "
            "class the original model's config.json lists (by hand, or --hf-overrides '{\"architectures\": [...]}')."]
