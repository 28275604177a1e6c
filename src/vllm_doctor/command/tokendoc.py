"""Edits on a token list (shell lines, docker run, compose lists) that keep the user's own style."""
from __future__ import annotations

import copy
import re
from operator import attrgetter
import shlex
from collections import Counter
from dataclasses import dataclass

from . import flags as F
from .layout import DOCKER_REPEATABLE, Item, Layout, analyse, docker_canonical
from .lexer import Token, quote_shell, quote_yaml
from .versions import parse_version

# vllm/vllm-openai images tagged before this had no `vllm serve`: their entrypoint, the api_server module,
# takes `--model M` (a tag of this release or later is assumed to take the model positionally)
_POSITIONAL_MODEL_IMAGE = "0.5.2"
_VLLM_IMAGE = re.compile(r"(^|/)vllm-openai(:|@|$)|(^|/)vllm/")

# how compose spells the docker options a remedy may ask for
COMPOSE_KEYS = {"--shm-size": "shm_size: {v}", "--ipc": "ipc: {v}", "--runtime": "runtime: {v}",
                 "--gpus": "gpus: {v}", "--privileged": "privileged: true", "--init": "init: true",
                 "--ulimit": "ulimits: {v}", "--network": "network_mode: {v}"}


_VALUE = attrgetter("value")


@dataclass
class TokenDoc:
    prefix: str
    tokens: list[Token]
    tail: str
    dialect: str = "shell"      # shell | flow | block
    compose: bool = False
    version: str | None = None

    # ---- reading -----------------------------------------------------------------------------
    def render(self) -> str:
        return self.prefix + "".join(t.sep + t.raw for t in self.tokens) + self.tail

    def layout(self) -> Layout:
        """The analysis of the tokens as they are now. Every reading and edit asks for it, often several
        times in a row without a change: it is kept until the token values change (the key is their
        tuple: one pass, where the analysis is many), so a huge command is analysed once per edit."""
        key = (self.compose, tuple(map(_VALUE, self.tokens)))
        cached = self.__dict__.get("_layout")
        if cached is None or cached[0] != key:
            cached = (key, analyse(self.tokens, compose=self.compose), {})
            self.__dict__["_layout"] = cached
        return cached[1]

    def matching(self, target: str) -> list[int]:
        """Positions in layout().items of the flags that are `target` (same()), in order: from an index of
        the layout's flags by canonical and by resolved name, built once per layout and version, so that
        asking for many flags of a long command does not compare each one with every argument."""
        lay = self.layout()
        indexes = self.__dict__["_layout"][2]
        index = indexes.get(self.version)
        if index is None:
            index = indexes[self.version] = {}
            for pos, it in enumerate(lay.items):
                if it.flag:
                    for key in {("c", F.canonical(it.flag)), ("r", F.resolve(it.flag, self.version))}:
                        index.setdefault(key, []).append(pos)
        hits = set(index.get(("c", F.canonical(target)), ()))
        resolved = F.resolve(target, self.version)
        if resolved is not None:
            hits.update(index.get(("r", resolved), ()))
        return sorted(hits)

    def same(self, written: str, target: str) -> bool:
        if F.canonical(written) == F.canonical(target):
            return True
        r = F.resolve(written, self.version)
        return r is not None and r == F.resolve(target, self.version)

    def fragment(self, it: Item) -> str:
        return " ".join(self.tokens[k].raw for k in [it.ftok, *it.vtoks])

    def env(self) -> dict[str, str]:
        lay = self.layout()
        host = dict(self.tokens[k].value.split("=", 1) for k in lay.env)
        if lay.shape != "docker":
            return host
        out = {}
        for it in lay.docker or []:
            if docker_canonical(it.flag) == "--env" and it.value:
                name, eq, val = it.value.partition("=")
                out[name] = val if eq else host.get(name, "")
        return out

    # ---- low-level token surgery -------------------------------------------------------------
    def quote(self, value: str, like: str | None = None) -> str:
        if self.dialect == "shell":
            return quote_shell(value, like)
        if like is None:   # new list items copy the quoting of the existing ones
            opt = value.startswith("-")   # flags copy flags' quoting, values copy values'
            same = [t.raw for t in self.tokens if t.value.startswith("-") == opt] or [t.raw for t in self.tokens]
            like = same[-1][0] if same and same[-1][:1] in "\"'" else None
        return quote_yaml(value, like, flow=self.dialect == "flow")

    def _remove(self, idxs: list[int]) -> None:
        """Delete these token positions in one pass (one `del` each was quadratic in a long command); the
        first token kept takes the separator of a deleted first token."""
        drop = set(idxs)
        if not drop:
            return
        kept = [t for k, t in enumerate(self.tokens) if k not in drop]
        if 0 in drop and kept:
            kept[0].sep = self.tokens[0].sep
        self.tokens[:] = kept

    def _insert(self, at: int, toks: list[Token]) -> None:
        if not self.tokens and toks and self.dialect != "block" and not self.prefix.rstrip().endswith(":"):
            toks[0].sep = ""   # first token of an empty command or list: no separator before it
        self.tokens[at:at] = toks

    def _tok(self, value: str, sep: str, like: str | None = None) -> Token:
        return Token(sep, self.quote(value, like), value)

    def _seps(self, lay: Layout) -> tuple[str, str]:
        """Separators for a new flag and for its value, copied from the user's command."""
        if self.dialect != "shell":
            last = self.tokens[-1].sep if self.tokens else ""
            default = ", " if self.dialect == "flow" else "\n- "
            s = last if last.strip(" \t") not in ("", "[") or self.dialect == "block" else default
            if self.dialect == "flow" and "," not in s:
                s = ", "
            return s or default, s or default
        fseps = [self.tokens[it.ftok].sep for it in lay.items if it.flag]
        fsep = next((s for s in reversed(fseps) if "\n" in s), " ")
        return fsep, " "

    # ---- flag edits --------------------------------------------------------------------------
    def _write_value(self, it: Item, value: str | None) -> None:
        toks = self.tokens
        ft = toks[it.ftok]
        if value is None:
            if it.inline:
                self._replace(it.ftok, it.flag, ft.raw)
            self._remove(it.vtoks)
            return
        if it.inline:
            if self.dialect == "shell":
                old = ft.raw.partition("=")[2] if "=" in ft.raw else None
                joiner = "" if it.flag == "-O" and "=" not in ft.value else "="
                raw = ft.raw.split("=", 1)[0] if "=" in ft.raw else it.flag
                ft.raw, ft.value = raw + joiner + quote_shell(value, old), it.flag + joiner + value
            else:
                self._replace(it.ftok, f"{it.flag}={value}", ft.raw)
            return
        parts = shlex.split(value) if F.is_multi_value(it.flag) and " " in value else [value]
        if it.vtoks:
            first = toks[it.vtoks[0]]
            self._remove(it.vtoks[1:])
            first.raw, first.value = self.quote(parts[0], first.raw), parts[0]
            vsep = " " if self.dialect == "shell" else first.sep
            self._insert(it.vtoks[0] + 1, [self._tok(p, vsep) for p in parts[1:]])
        else:
            _, vsep = self._seps(self.layout())
            self._insert(it.ftok + 1, [self._tok(p, vsep) for p in parts])

    def _replace(self, k: int, value: str, like: str) -> None:
        self.tokens[k].raw, self.tokens[k].value = self.quote(value, like), value

    def _new_flag_tokens(self, lay: Layout, flag: str, value: str | None) -> list[Token]:
        fsep, vsep = self._seps(lay)
        written = [it.flag for it in lay.items if it.flag and it.flag.startswith("--")]
        if written and all("_" in w for w in written):      # the user spells --max_model_len
            flag = "--" + flag[2:].replace("-", "_")
        if value is None:
            return [self._tok(flag, fsep)]
        styles = Counter(it.inline for it in lay.items if it.flag and it.value is not None)
        if styles[True] > styles[False]:
            if self.dialect == "shell":
                return [Token(fsep, flag + "=" + quote_shell(value), flag + "=" + value)]
            return [self._tok(f"{flag}={value}", fsep)]
        parts = shlex.split(value) if F.is_multi_value(flag) and " " in value else [value]
        return [self._tok(flag, fsep)] + [self._tok(p, vsep) for p in parts]

    def set_flag(self, flag: str, value: str | None, notes: list[str]) -> None:
        c = F.canonical(flag)
        lay = self.layout()
        matches = [it for it in lay.items if it.flag and self.same(it.flag, c)]
        if c == "--model" and not matches and lay.shape in ("serve", "docker", "compose"):
            pos = next((it for it in lay.items if it.flag is None), None)
            if pos is not None and value is not None:
                self._replace(pos.ftok, value, self.tokens[pos.ftok].raw)
                return
        opposite = {F.negation(c, self.version)} | ({"--" + c[5:]} if c.startswith("--no-") else set())
        drop = [it for it in lay.items if it.flag and any(o and self.same(it.flag, o) for o in opposite)]
        for it in matches[1:] + drop:
            notes.append(f"dropped {self.fragment(it)} (replaced by {c}{'' if value is None else ' ' + value})")
        self._remove([k for it in matches[1:] + drop for k in [it.ftok, *it.vtoks]])
        lay = self.layout()
        matches = [it for it in lay.items if it.flag and self.same(it.flag, c)]
        if matches:
            self._write_value(matches[0], value)
        else:
            self._insert(len(self.tokens), self._new_flag_tokens(lay, c, value))

    def remove_flag(self, flag: str) -> bool:
        lay = self.layout()
        hits = [it for it in lay.items if it.flag and self.same(it.flag, flag)]
        self._remove([k for it in hits for k in [it.ftok, *it.vtoks]])
        return bool(hits)

    def split_glued(self, notes: list[str]) -> None:
        """'--port 6379' passed as ONE argument: argparse would not see an option; split it."""
        for it in reversed(self.layout().items):
            tok = self.tokens[it.ftok]
            if it.flag and any(ch.isspace() for ch in it.flag):
                try:
                    parts = shlex.split(tok.value)
                except ValueError:
                    parts = tok.value.split()
                _, vsep = self._seps(self.layout())
                new = [self._tok(parts[0], tok.sep, tok.raw if self.dialect != "shell" else None)]
                new += [self._tok(p, vsep) for p in parts[1:]]
                self.tokens[it.ftok:it.ftok + 1] = new
                notes.append(f"the single argument {tok.raw} was split into {' '.join(parts)} "
                             "(as one argument vLLM's parser does not see an option)")

    # ---- environment and container options ---------------------------------------------------
    def set_env(self, name: str, value: str, notes: list[str]) -> None:
        if self.compose:
            notes.append(f"set {name}={value} under `environment:` of this service")
            return
        lay = self.layout()
        if lay.shape == "docker":
            return self._docker_env(lay, name, value)
        for k in lay.env:
            t = self.tokens[k]
            if t.value.split("=", 1)[0] == name:
                t.raw = name + "=" + quote_shell(value, t.raw.partition("=")[2])
                t.value = f"{name}={value}"
                return
        at = lay.env_insert
        new = Token(" " if at else (self.tokens[0].sep if self.tokens else ""),
                    name + "=" + quote_shell(value), f"{name}={value}")
        if at == 0 and self.tokens:
            self.tokens[0].sep = " "
        self._insert(at, [new])

    def _docker_env(self, lay: Layout, name: str, value: str) -> None:
        envs = [it for it in lay.docker if docker_canonical(it.flag) == "--env"]
        for it in envs:
            if (it.value or "").split("=", 1)[0] == name:
                k = it.vtoks[0] if it.vtoks else it.ftok
                t = self.tokens[k]
                if it.vtoks:
                    t.raw, t.value = quote_shell(f"{name}={value}", t.raw), f"{name}={value}"
                else:
                    t.raw = t.raw.split("=", 1)[0] + "=" + quote_shell(f"{name}={value}")
                    t.value = f"{it.flag}={name}={value}"
                return
        spell = envs[-1].flag if envs else "-e"
        if envs:
            last = envs[-1]
            at, sep = max([last.ftok, *last.vtoks]) + 1, self.tokens[last.ftok].sep
        else:
            at, sep = lay.image, self.tokens[lay.image].sep if lay.image < len(self.tokens) else " "
        self._insert(at, [Token(sep, spell, spell), Token(" ", quote_shell(f"{name}={value}"), f"{name}={value}")])

    def docker_option(self, name: str, value: str | None, notes: list[str]) -> None:
        lay = self.layout()
        shown = name if value is None else f"{name} {value}"
        if self.compose:
            key = COMPOSE_KEYS.get(docker_canonical(name))
            notes.append(f"container option {shown}: set `{key.format(v=value)}` in this compose service"
                         if key else f"container option {shown}: set the matching compose key")
            return
        if lay.shape != "docker":
            notes.append(f"container option {shown} ignored: this command does not start a container")
            return
        cname = docker_canonical(name)
        hits = [it for it in lay.docker if docker_canonical(it.flag) == cname]
        if cname in DOCKER_REPEATABLE:
            if any(it.value == value for it in hits):
                return
            hits = []
        if hits:
            self._remove([k for it in hits[1:] for k in [it.ftok, *it.vtoks]])
            it = hits[0]
            if value is not None and it.inline:
                t = self.tokens[it.ftok]
                t.raw = t.raw.split("=", 1)[0] + "=" + quote_shell(value, t.raw.partition("=")[2])
                t.value = f"{it.flag}={value}"
            elif value is not None and it.vtoks:
                self._replace(it.vtoks[0], value, self.tokens[it.vtoks[0]].raw)
            elif value is not None:
                self._insert(it.ftok + 1, [Token(" ", quote_shell(value), value)])
            return
        sep = self.tokens[lay.image].sep if lay.image < len(self.tokens) else " "
        inline = Counter(it.inline for it in lay.docker if it.value is not None and it.flag.startswith("--"))
        if value is None:
            new = [Token(sep, name, name)]
        elif inline[True] > inline[False]:
            new = [Token(sep, f"{name}={quote_shell(value)}", f"{name}={value}")]
        else:
            new = [Token(sep, name, name), Token(" ", quote_shell(value), value)]
        self._insert(lay.image, new)

    # ---- launcher and model ------------------------------------------------------------------
    def _entrypoint(self, lay: Layout) -> str | None:
        return next((it.value for it in lay.docker or [] if docker_canonical(it.flag) == "--entrypoint"), None)

    def drop_launcher(self, notes: list[str]) -> None:
        """`IMAGE vllm serve M …` -> `IMAGE M …`; `IMAGE python3 -m vllm.entrypoints.openai.api_server --model M`
        -> `IMAGE --model M`; the same for the leading items of a compose `command:`."""
        lay = self.layout()
        if lay.shape == "docker":
            entry = self._entrypoint(lay)
            if entry:
                notes.append(f"launcher words kept: --entrypoint {entry} replaces the image's entrypoint")
                return
            start = lay.image
            if start is None or start >= len(self.tokens):
                notes.append("launcher words not dropped: no image found in this docker command")
                return
            image = self.tokens[start].value
            start += 1
            if not _VLLM_IMAGE.search(image):
                notes.append(f"assumed the entrypoint of {image} already runs the vLLM server")
        elif self.compose:
            start = 0
        else:
            notes.append("launcher kept: this command starts no container image whose entrypoint runs the server")
            return
        if lay.launcher in ("serve", "module"):
            end = lay.args_start
        elif start < len(self.tokens) and self.tokens[start].value == "serve":   # `IMAGE serve M`
            end = start + 1
        else:
            return
        self._cut(start, end)

    def _cut(self, start: int, end: int) -> None:
        """Delete tokens[start:end]; what follows takes the first deleted token's separator (in a shell
        line, keep the follower's own when only it has a line continuation)."""
        first = self.tokens[start].sep
        if end < len(self.tokens):
            nxt = self.tokens[end]
            if self.dialect != "shell" or "\n" in first or "\n" not in nxt.sep:
                nxt.sep = first
        del self.tokens[start:end]

    def _insert_args(self, at: int, new: list[Token]) -> None:
        """Insert tokens at the start of the vLLM arguments, separators copied from the user's list."""
        if not new:
            return
        if self.dialect == "shell":
            new[0].sep = " " if at > 0 else (self.tokens[0].sep if self.tokens else "")
            if at == 0 and self.tokens:
                self.tokens[0].sep = " "
        elif at < len(self.tokens):
            new[0].sep = self.tokens[at].sep
            if at == 0:
                self.tokens[0].sep = self._seps(self.layout())[0]
        self._insert(at, new)

    def _legacy_image(self, lay: Layout) -> bool:
        """A vllm-openai image tagged older than `vllm serve` (its entrypoint takes `--model M`)."""
        if lay.image is None or lay.image >= len(self.tokens):
            return False
        image = self.tokens[lay.image].value
        name, _, tag = image.rpartition(":")
        if "/" in tag or not name or not _VLLM_IMAGE.search(name):
            return False
        v = parse_version(tag)
        return v is not None and v < parse_version(_POSITIONAL_MODEL_IMAGE)

    def set_model(self, value: str, notes: list[str]) -> None:
        """The model the way this shape takes it (see edits.SetModel)."""
        lay = self.layout()
        models = [it for it in lay.items if it.flag and self.same(it.flag, "--model")]
        legacy = lay.launcher == "module" or lay.shape == "unknown" or (
            lay.shape == "docker" and lay.launcher == "image" and bool(models) and self._legacy_image(lay))
        if legacy:
            self._set_model_flag(lay, value, models, notes)
        else:
            self._set_model_positional(lay, value, models)

    def _set_model_flag(self, lay: Layout, value: str, models: list[Item], notes: list[str]) -> None:
        if models:
            self.set_flag("--model", value, notes)
            return
        new = self._new_flag_tokens(lay, "--model", value)
        first = lay.items[0] if lay.items else None
        if first is not None and first.flag is None and first.ftok == lay.args_start and lay.shape != "unknown":
            # the api_server takes no positional model: `M --port 1` -> `--model M --port 1`
            new[0].sep = self.tokens[first.ftok].sep
            self.tokens[first.ftok:first.ftok + 1] = new
            return
        if lay.shape == "unknown":
            self._insert(len(self.tokens), new)
        else:
            self._insert_args(lay.args_start, new)

    def _set_model_positional(self, lay: Layout, value: str, models: list[Item]) -> None:
        pos = next((it for it in lay.items if it.flag is None), None)
        if pos is not None:
            self._replace(pos.ftok, value, self.tokens[pos.ftok].raw)
            self._remove([k for it in models for k in [it.ftok, *it.vtoks]])
            return
        first = models[0] if models else None
        if first is not None and first.ftok == lay.args_start:
            # `--model M` leads the arguments: it becomes `M` in place, keeping its separator
            ft = self.tokens[first.ftok]
            if first.vtoks:
                vt = self.tokens[first.vtoks[0]]
                vt.raw, vt.value, vt.sep = self.quote(value, vt.raw), value, ft.sep
                drop = [first.ftok, *first.vtoks[1:]]
            else:
                like = ft.raw.partition("=")[2] if first.inline and "=" in ft.raw else None
                ft.raw, ft.value = self.quote(value, like), value
                drop = []
            self._remove(drop + [k for it in models[1:] for k in [it.ftok, *it.vtoks]])
            return
        self._remove([k for it in models for k in [it.ftok, *it.vtoks]])
        self._insert_args(lay.args_start, [self._tok(value, " ")])

    def copy(self) -> "TokenDoc":
        return copy.deepcopy(self)

    def __deepcopy__(self, memo: dict) -> "TokenDoc":
        """New Token objects (edits change them in place), everything else shared: the fields are strings
        and the kept layout describes the same token values (copy.deepcopy's generic walk over a long
        command's tokens and layout cost seconds)."""
        new = TokenDoc(self.prefix, [Token(t.sep, t.raw, t.value) for t in self.tokens], self.tail, self.dialect,
                       self.compose, self.version)
        if "_layout" in self.__dict__:
            new.__dict__["_layout"] = self.__dict__["_layout"]
        memo[id(self)] = new
        return new
