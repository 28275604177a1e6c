"""A fix in the user's own launch shape: a runnable command, an edit of the file the launch lives in, or
only the flag changes (remedies produce edits; this decides how they reach the user).

What is never shown as the command to run: a command made up around a placeholder model, vLLM flags
appended to `python gen.py` or `docker compose up`, and the failing command unchanged.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_doctor.command.edits import DockerOption, DropLauncher, Edit, RemoveFlag, SetEnv, SetFlag, SetModel
from vllm_doctor.command.layout import docker_canonical
from vllm_doctor.command.tokendoc import COMPOSE_KEYS     # a compose service's key for each container option
from vllm_doctor.findings import Rewrite

if TYPE_CHECKING:
    from vllm_doctor.command.model import Command
    from vllm_doctor.facts import Facts

# vLLM flags whose default is the same in every release: setting one to it where the command does not
# have it changes nothing (`--pipeline-parallel-size 1` added to every TP fix).
FIXED_DEFAULTS = {"--pipeline-parallel-size": "1", "--tensor-parallel-size": "1", "--data-parallel-size": "1",
                  "--kv-cache-dtype": "auto", "--dtype": "auto"}

# container options in a pod spec (a compose service takes them as keys: command/tokendoc.py)
POD_SPEC = {"--shm-size": "mount an `emptyDir: {{medium: Memory, sizeLimit: {v}}}` volume at /dev/shm",
            "--ipc": "set `hostIPC: true` in the pod spec", "--gpus": "set `resources.limits: "
            "{{nvidia.com/gpu: {v}}}` on the container", "--privileged": "set `securityContext.privileged: true`"}


def without_defaults(command: Command | None, edits: list[Edit], known: bool = True) -> list[Edit]:
    """Drop a SetFlag to a fixed default the command does not set otherwise. `known`: the command is the
    whole launch (the user's, or rebuilt from a complete argument dump); in a partial one a flag's absence
    says nothing, and the log may show it set (`tp_size` 4 in an assertion)."""
    out = []
    for e in edits:
        if (isinstance(e, SetFlag) and e.flag in FIXED_DEFAULTS and FIXED_DEFAULTS[e.flag] == e.value
                and command is not None and known):
            if command.get(e.flag) in (None, False, e.value):
                continue
        out.append(e)
    return out


def describe(e: Edit, command: Command | None = None) -> str:
    """One edit as a person reads it: `--tensor-parallel-size 3 -> 2`, `add --enforce-eager`."""
    old = command.get(e.flag) if command is not None and isinstance(e, (SetFlag, RemoveFlag)) else None
    if isinstance(e, SetFlag):
        if e.value is None:
            return f"add {e.flag}"
        return f"{e.flag} {old} -> {e.value}" if isinstance(old, str) and old != e.value else f"{e.flag} {e.value}"
    if isinstance(e, RemoveFlag):
        return f"remove {e.flag}" + (f" {old}" if isinstance(old, str) else "")
    if isinstance(e, SetEnv):
        return f"environment {e.name}={e.value}"
    if isinstance(e, DockerOption):
        return f"container option {e.name}" + (f" {e.value}" if e.value is not None else "")
    if isinstance(e, SetModel):
        return f"model {e.value}"
    if isinstance(e, DropLauncher):
        return "drop the `vllm serve` words after the image (its entrypoint runs the server)"
    return str(e)


def _container_edits(edits: list[Edit], keys: dict[str, str]) -> list[str]:
    out = []
    for e in edits:
        if isinstance(e, DockerOption):
            template = keys.get(docker_canonical(e.name))
            value = e.value if e.value is not None else "true"
            out.append(template.format(v=value) if template else describe(e))
    return out


def _script_edit(facts: Facts, edits: list[Edit]) -> Rewrite | None:
    """`gen.py line 4: LLM(..., tensor_parallel_size=2)` from the frame the traceback shows."""
    where, code = facts.get("launch.script"), facts.get("launch.script_code")
    if not where or not code:
        return None
    from vllm_doctor.command.model import Command

    flags = [e for e in edits if isinstance(e, (SetFlag, RemoveFlag, SetModel))]
    call = Command.parse(code.strip())
    changes = [describe(e, call if call.shape == "python" else None) for e in edits]
    if call.shape == "python":
        new = call.apply(flags).render()
        rest = [describe(e) for e in edits if e not in flags]
        extra = f"; also {'; '.join(rest)}" if rest else ""
        return Rewrite("edit", new, code.strip(), changes, f"{where}: `{new}`{extra}")
    from vllm_doctor.command.pyapi import kwarg_for

    kwargs = ", ".join(f"{name}={value!r}" for name, value in (kwarg_for(e.flag, e.value) for e in flags
                                                                 if isinstance(e, SetFlag)))
    return Rewrite("edit", None, code.strip(), changes,
                   f"{where}: in the call that starts `{code.strip()[:60]}`, set {kwargs or '; '.join(changes)}")


def _manifest_edit(command: Command, edits: list[Edit], service: str | None, was: str | None) -> Rewrite:
    kind = command.manifest
    flags = [e for e in edits if not isinstance(e, DockerOption)]
    changes = [describe(e, command) for e in edits] or list(command.notes)
    if kind == "kubernetes":
        container = _container_edits(edits, POD_SPEC)
        where = "in the container's `args:`"
    else:
        container = _container_edits(edits, COMPOSE_KEYS)
        where = f"in `command:` of service {service}" if service else "in the vLLM service's `command:`"
    new = command.apply(flags).render() if command.runs_vllm else None
    if new is not None and isinstance(was, str) and new.split() == was.split():
        new = None
    parts = []
    if new:
        parts.append(f"{where}, use: {new}")
    elif flags:
        parts.append(f"{where}, set: " + "; ".join(describe(e) for e in flags))
    if container:
        parts.append(("in the pod spec: " if kind == "kubernetes" else "in the service: ") + "; ".join(container))
    parts.append("then redeploy" if kind == "kubernetes" else "then `docker compose up` again")
    return Rewrite("edit", new, was if new else None, changes, "; ".join(parts))


def present(command: Command | None, edits: list[Edit], facts: Facts, service: str | None = None) -> Rewrite:
    """The Rewrite for `edits` on the user's launch (see findings.Rewrite for the forms)."""
    reconstructed = bool(facts.get("launch.reconstructed"))
    edits = without_defaults(command, list(edits), known=not (reconstructed and _untrustworthy(facts)))
    was = facts.get("launch.command")
    repaired = command is not None and isinstance(was, str) and command.render().split() != was.split()
    if not edits and not repaired:
        return Rewrite("outside", None, was, [], "rerun your command")
    # else parsing repaired the command itself (a compose item `"--dtype auto"` split in two): that is the fix
    if command is not None and command.manifest:
        return _manifest_edit(command, edits, service, was)
    script = _script_edit(facts, edits)
    if command is not None and command.shape == "python":     # --cmd 'llm = LLM(...)'
        done = _rendered(command, edits, was, "edit")
        if done is not None and done.form == "edit":
            done.instruction = script.instruction if script else f"in your script, use: {done.command}"
        return done or _flags(None, edits)
    if command is not None and not command.runs_vllm and not command.shell_launcher and _takes_them(command, edits):
        return _rendered(command, edits, was, "command") or _flags(command, edits)
    if command is None or (reconstructed and (script or _untrustworthy(facts))) or not command.runs_vllm:
        if script is not None and not all(isinstance(e, SetEnv) for e in edits):
            return script
        env_only = command is not None and all(isinstance(e, SetEnv) for e in edits)
        if env_only and not reconstructed:   # `bash start.sh`, `python gen.py`: an environment prefix reaches vLLM
            return _rendered(command, edits, was, "command") or _flags(command, edits)
        return _flags(command, edits)
    return _rendered(command, edits, was, "rebuilt" if reconstructed else "command") or _flags(command, edits)


def _takes_them(command: Command, edits: list[Edit]) -> bool:
    """`python serve.py --model m --tensor-parallel-size 3`: a script that already takes every flag the fix
    changes (built on vLLM's argument parser) gets them edited in place; flags it does not show are not
    appended, since nothing says it would pass them on."""
    flags = [e for e in edits if isinstance(e, (SetFlag, RemoveFlag))]
    return bool(flags) and all(isinstance(e, (SetFlag, RemoveFlag, SetEnv)) for e in edits) and all(
        command.get(e.flag) is not None for e in flags)


def _untrustworthy(facts: Facts) -> bool:
    """A rebuilt command that would be made up: no model known, or the logged arguments were cut."""
    return not facts.get("args.model") or bool(facts.get("launch.args_cut"))


def _rendered(command: Command, edits: list[Edit], was: str | None, form: str) -> Rewrite | None:
    try:
        new = command.apply(edits).render()
    except Exception:
        return None
    changes = [describe(e, command) for e in edits] or list(command.notes)
    if isinstance(was, str) and new.split() == was.split():
        return Rewrite("outside", None, was, changes, "rerun your command")
    return Rewrite(form, new, was if isinstance(was, str) else command.render(), changes)


def _flags(command: Command | None, edits: list[Edit]) -> Rewrite:
    changes = [describe(e, command) for e in edits]
    known = command is not None and not command.runs_vllm and command.render()
    where = (f"`{command.render()}` does not take vLLM's flags itself: make these changes where it starts vLLM"
             if known else "no launch line in the log: --cmd \"...\" rewrites your own command")
    return Rewrite("flags", None, None, changes, where)
