"""The launch command every remedy edits: parse any launch shape, edit it with Edit objects, render it
back in the user's own shape and style (see docs/DESIGN.md, "Command model")."""
from __future__ import annotations

import copy
import re
from typing import Iterable

from . import flags as F
from .edits import DockerOption, DropLauncher, Edit, RemoveFlag, SetEnv, SetFlag, SetModel
from .fromargs import args_to_argv, argv_to_text, parse_args_repr
from .layout import DOCKER_REPEATABLE, docker_canonical
from .lexer import lex_shell, lex_yaml_block, lex_yaml_flow
from .pyapi import PyCall, looks_like_python
from .tokendoc import TokenDoc

_COMPOSE_KEY = re.compile(r"(\s*(?:command|args)\s*:)")


def _compose_doc(text: str) -> TokenDoc | None:
    """A compose/Kubernetes `command:` as a flow list, block list or string; None if it is not one."""
    m = _COMPOSE_KEY.match(text)
    head, body = (m.group(1), text[m.end():]) if m else ("", text)
    stripped = body.lstrip()
    if stripped.startswith("["):
        pre, toks, tail = lex_yaml_flow(body)
        return TokenDoc(head + pre, toks, tail, "flow", compose=True)
    if re.match(r"\s*-\s", body) and (m or "\n" in text.strip() or stripped.startswith("- ")):
        toks, tail = lex_yaml_block(body)
        return TokenDoc(head, toks, tail, "block", compose=True) if toks else None
    if not m:
        return None
    lead = body[:len(body) - len(stripped)]
    q = stripped[:1] if stripped[:1] in "\"'" else ""
    inner = stripped[len(q):]
    end = inner.rfind(q) if q else len(inner)
    toks, tail = lex_shell(inner[:end])
    return TokenDoc(head + lead + q, toks, tail + inner[end:], "shell", compose=True)


class Command:
    """A parsed launch command. Immutable in use: apply() returns a new Command."""

    def __init__(self, doc: TokenDoc | None = None, py: PyCall | None = None,
                 version: str | None = None, notes: list[str] | None = None):
        self._doc, self._py = doc, py
        self.version = version
        self.notes: list[str] = list(notes or [])
        if doc is not None:
            doc.version = version

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, *, version: str | None = None) -> "Command":
        """Any launch shape: vllm serve, python -m vllm.entrypoints…, env prefixes, docker/podman run,
        compose `command:` lists, or the Python API `LLM(...)`. Unknown shapes keep their text."""
        if looks_like_python(text):
            py = PyCall(text)
            if py.ok():
                return cls(py=py, version=version)
        doc = _compose_doc(text)
        if doc is None:
            toks, tail = lex_shell(text)
            doc = TokenDoc("", toks, tail)
        cmd = cls(doc=doc, version=version)
        doc.split_glued(cmd.notes)
        return cmd

    @classmethod
    def from_args(cls, args: dict | str, *, version: str | None = None) -> "Command":
        """`vllm serve MODEL --flag value …` from a logged `non-default args` dict or an
        `args: Namespace(...)` dump (where only values differing from vLLM's defaults are kept).
        Releases before 0.5.2 get `python -m vllm.entrypoints.openai.api_server --model M`."""
        namespace = isinstance(args, str) and args.strip().startswith("Namespace(")
        if isinstance(args, str):
            args = parse_args_repr(args)
        namespace = namespace or "subparser" in args or "dispatch_function" in args or len(args) > 40
        argv, notes = args_to_argv(args, version, namespace)
        cmd = cls.parse(argv_to_text(argv), version=version)
        cmd.notes += notes
        return cmd

    # ---- reading -----------------------------------------------------------------------------
    @property
    def shape(self) -> str:
        """serve | module | docker | compose | python | unknown"""
        return "python" if self._py else self._doc.layout().shape

    @property
    def shell_launcher(self) -> bool:
        """A shell or shell script runs vLLM (`bash start.sh`, `sh -c "..."`, `./serve.sh`): its own
        flags would not reach vLLM, only an environment prefix does."""
        return not self._py and self._doc.layout().launcher == "shell"

    @property
    def manifest(self) -> str | None:
        """Where this launch is written when it is not a command line: "compose" (a compose service's
        `command:`), "kubernetes" (a container's `args:`, or `kubectl`/`helm`), "compose-cli"
        (`docker compose up`: the command is in the compose file); None for a runnable command line."""
        if self._py:
            return None
        if self._doc.compose:
            return "kubernetes" if self._doc.prefix.lstrip().startswith("args") else "compose"
        words = [t.value for t in self._doc.tokens[:3]]
        if words[:1] in (["kubectl"], ["helm"]):
            return "kubernetes"
        if words[:2] == ["docker", "compose"] or words[:1] in (["docker-compose"], ["podman-compose"]):
            return "compose-cli"
        return None

    @property
    def runs_vllm(self) -> bool:
        """The command line itself starts vLLM with these arguments: `vllm serve`, `python -m vllm…`, a
        container image (its entrypoint is the server), a compose list, or LLM(...). Not `python gen.py`,
        `bash start.sh` or `docker compose up`, whose vLLM arguments live in a file."""
        if self._py:
            return True
        lay = self._doc.layout()
        return lay.shape in ("serve", "module", "compose") or (lay.shape == "docker" and lay.image is not None
                                                                and lay.image < len(self._doc.tokens))

    def render(self) -> str:
        return self._py.text if self._py else self._doc.render()

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"Command({self.render()!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Command) and self.render() == other.render()

    def get(self, flag: str):
        """The flag's value (aliases, '_' spellings, abbreviations understood): str; True for a switch
        that is present; False when explicitly negated (--no-X, X=False); None when absent."""
        if self._py:
            return self._py.get(flag)
        c = F.canonical(flag)
        neg = F.negation(c, self.version)
        lay = self._doc.layout()
        result = None
        hits = self._doc.matching(c)
        negated = self._doc.matching(neg) if neg else []
        last = max(hits[-1:] + negated[-1:], default=None)     # the last spelling given wins, as in argparse
        if last is not None:
            it = lay.items[last]
            result = (True if it.value is None else it.value) if hits and hits[-1] == last else False
        if result is None and c == "--model" and lay.shape in ("serve", "docker", "compose"):
            result = next((it.value for it in lay.items if it.flag is None), None)
        return result

    def has(self, flag: str) -> bool:
        v = self.get(flag)
        return v is not None and v is not False

    @property
    def env(self) -> dict[str, str]:
        """Environment the server gets: the NAME=V prefix, or `-e` options in docker."""
        return {} if self._py else self._doc.env()

    @property
    def model(self) -> str | None:
        m = self.get("--model")
        return m if isinstance(m, str) else None

    def argv(self) -> list[str]:
        """The serve arguments as vLLM's parser receives them (for flags.accepts())."""
        if self._py:
            return []
        lay = self._doc.layout()
        return [t.value for t in self._doc.tokens[lay.args_start:]]

    def docker_options(self) -> dict[str, str | None]:
        lay = None if self._py else self._doc.layout()
        if not lay or lay.docker is None:
            return {}
        return {docker_canonical(it.flag): it.value for it in lay.docker}

    @property
    def image(self) -> str | None:
        """The image a `docker run` starts ("vllm/vllm-openai:v0.9.2"); None in other shapes."""
        lay = None if self._py else self._doc.layout()
        if not lay or lay.docker is None or lay.image is None or lay.image >= len(self._doc.tokens):
            return None
        return self._doc.tokens[lay.image].value

    def docker_values(self, name: str) -> list[str | None]:
        """Every value of one `docker run` option (any spelling: -v or --volume), in order; [] when the
        command starts no container. docker_options() keeps only the last of a repeated option."""
        lay = None if self._py else self._doc.layout()
        if not lay or lay.docker is None:
            return []
        name = docker_canonical(name)
        return [it.value for it in lay.docker if docker_canonical(it.flag) == name]

    # ---- editing -----------------------------------------------------------------------------
    def apply(self, edits: Iterable[Edit]) -> "Command":
        new = Command(copy.deepcopy(self._doc), copy.deepcopy(self._py), self.version, self.notes)
        for e in edits:
            new._apply_one(e)
        return new

    def _apply_one(self, e: Edit) -> None:
        if self._py:
            if isinstance(e, SetFlag):
                self._py.set_flag(e.flag, e.value)
            elif isinstance(e, RemoveFlag):
                self._py.remove_flag(e.flag)
            elif isinstance(e, SetEnv):
                self._py.set_env(e.name, e.value)
                self.notes.append(f"{e.name} is set in os.environ before LLM(...); it must run before vllm "
                                  "starts the engine (or export it in the shell)")
            elif isinstance(e, DockerOption):
                self.notes.append(f"container option {e.name} ignored: the Python API starts no container")
            elif isinstance(e, SetModel):
                self._py.set_model(e.value)
            elif isinstance(e, DropLauncher):
                self.notes.append("launcher words not dropped: the Python API starts no container image")
            else:
                raise TypeError(f"not an edit: {e!r}")
            return
        if isinstance(e, SetFlag):
            self._doc.set_flag(e.flag, e.value, self.notes)
        elif isinstance(e, RemoveFlag):
            self._doc.remove_flag(e.flag)
        elif isinstance(e, SetEnv):
            self._doc.set_env(e.name, e.value, self.notes)
        elif isinstance(e, DockerOption):
            self._doc.docker_option(e.name, e.value, self.notes)
        elif isinstance(e, DropLauncher):
            self._doc.drop_launcher(self.notes)
        elif isinstance(e, SetModel):
            self._doc.set_model(e.value, self.notes)
        else:
            raise TypeError(f"not an edit: {e!r}")

    # ---- comparing ---------------------------------------------------------------------------
    def _parts(self) -> dict[tuple[str, str], str]:
        if self._py:
            return {("flag", n): src for n, src in self._py.items()}
        d, lay = self._doc, self._doc.layout()
        out: dict[tuple[str, str], str] = {}
        for k in lay.env:
            out[("env", d.tokens[k].value.split("=", 1)[0])] = d.tokens[k].raw
        for it in lay.docker or []:
            name = docker_canonical(it.flag)
            if name == "--env":
                key = ("env", (it.value or "").split("=", 1)[0])
            else:
                key = ("docker", name + (" " + (it.value or "") if name in DOCKER_REPEATABLE else ""))
            out[key] = d.fragment(it)
        model_seen = False
        for it in lay.items:
            if it.flag is None:
                if not model_seen and lay.shape in ("serve", "docker", "compose"):
                    out[("model", "model")] = d.tokens[it.ftok].raw
                    model_seen = True
                continue
            key = F.resolve(it.flag, self.version) or F.canonical(it.flag)
            out[("flag", key)] = d.fragment(it)
        return out

    def diff(self, other: "Command") -> list[tuple[str, str | None, str | None]]:
        """What changed from self to other: (kind, old, new) with kind flag|env|docker|model;
        old is None for an addition, new is None for a removal."""
        a, b = self._parts(), other._parts()
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                out.append((key[0], a.get(key), b.get(key)))
        return out
