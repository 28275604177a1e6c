"""The Python API shape: `llm = LLM(model="…", tensor_parallel_size=3)`; edits become keyword arguments."""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from . import flags as F

_CALL = re.compile(r"\b(?:vllm\.)?(?:LLM|AsyncEngineArgs|EngineArgs)\s*\(")
# boolean fields whose name really starts with disable_ (everything else maps --disable-X to enable_X=False)
_DISABLE_FIELDS = {"disable_custom_all_reduce", "disable_sliding_window", "disable_log_stats",
                   "disable_cascade_attn", "disable_chunked_mm_input", "disable_hybrid_kv_cache_manager",
                   "disable_async_output_proc", "disable_log_requests"}


def looks_like_python(text: str) -> bool:
    return bool(_CALL.search(text)) and "vllm serve" not in text and "-m vllm." not in text


def kwarg_for(flag: str, value: str | None) -> tuple[str, object]:
    """('--tensor-parallel-size', '2') -> ('tensor_parallel_size', 2); switches -> True/False."""
    c = F.canonical(flag)
    if c.startswith("--no-"):
        return c[5:].replace("-", "_"), False
    name = c[2:].replace("-", "_")
    if name.startswith("disable_") and name not in _DISABLE_FIELDS and F.is_known("--enable-" + c[10:]):
        return "enable_" + name[8:], False
    if value is None:
        return name, True
    for conv in (int, float):
        try:
            return name, conv(value)
        except ValueError:
            pass
    if value[:1] in "{[":
        try:
            return name, json.loads(value)
        except ValueError:
            pass
    return name, value


@dataclass
class PyCall:
    text: str

    def _call(self) -> tuple[int, ast.Call] | None:
        m = _CALL.search(self.text)
        if not m:
            return None
        depth, i, quote = 0, m.end() - 1, None
        while i < len(self.text):
            c = self.text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        try:
            node = ast.parse(self.text[m.start():i + 1], mode="eval").body
        except SyntaxError:
            return None
        return m.start(), node

    def ok(self) -> bool:
        return self._call() is not None

    def _off(self, base: int, lineno: int, col: int) -> int:
        seg = self.text[base:]
        lines = seg.split("\n")
        return base + sum(len(ln) + 1 for ln in lines[:lineno - 1]) + col

    def _span(self, base: int, node: ast.AST) -> tuple[int, int]:
        return self._off(base, node.lineno, node.col_offset), self._off(base, node.end_lineno, node.end_col_offset)

    def kwargs(self) -> list[tuple[str, int, int, int, int, ast.expr]]:
        """(name, kw_start, kw_end, value_start, value_end, value_node) for each keyword."""
        base, call = self._call()
        out = []
        for kw in call.keywords:
            if kw.arg is None:
                continue
            ks, ke = self._span(base, kw)
            vs, ve = self._span(base, kw.value)
            out.append((kw.arg, ks, ke, vs, ve, kw.value))
        return out

    @staticmethod
    def _value(node: ast.expr, src: str):
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, bool) else str(node.value)
        return src

    def get(self, flag: str):
        name, _ = kwarg_for(flag, "x")
        for kname, _, _, vs, ve, node in self.kwargs():
            if kname == name:
                return self._value(node, self.text[vs:ve])
        if name == "model":
            base, call = self._call()
            if call.args:
                s, e = self._span(base, call.args[0])
                return self._value(call.args[0], self.text[s:e])
        return None

    def items(self) -> list[tuple[str, str]]:
        return [(n, self.text[ks:ke]) for n, ks, ke, *_ in self.kwargs()]

    def _literal(self, obj) -> str:
        if isinstance(obj, str):
            q = '"' if self.text.count('"') >= self.text.count("'") else "'"
            return json.dumps(obj) if q == '"' else repr(obj)
        return repr(obj)

    def set_flag(self, flag: str, value: str | None) -> None:
        name, obj = kwarg_for(flag, value)
        self._set_kw(name, self._literal(obj))

    def _set_kw(self, name: str, lit: str) -> None:
        for kname, _, _, vs, ve, _ in self.kwargs():
            if kname == name:
                self.text = self.text[:vs] + lit + self.text[ve:]
                return
        base, call = self._call()
        args = [*call.args, *call.keywords]
        close = self._span(base, call)[1] - 1
        if not args:
            self.text = f"{self.text[:close]}{name}={lit}{self.text[close:]}"
            return
        last_end = self._span(base, args[-1])[1]
        between = self.text[last_end:close]
        first_start = self._span(base, args[0])[0]
        open_ = self.text.index("(", self._span(base, call.func)[1])
        t = self.text
        if "\n" not in t[open_ + 1:first_start]:          # one line: LLM(model="m", tp=3)
            self.text = f"{t[:last_end]}, {name}={lit}{t[last_end:]}"
            return
        indent = re.search(r"[ \t]*$", t[:first_start]).group(0)   # one keyword per line
        if between.lstrip().startswith(","):
            ci = last_end + between.index(",") + 1
            self.text = f"{t[:ci]}\n{indent}{name}={lit},{t[ci:]}"
        else:
            self.text = f"{t[:last_end]},\n{indent}{name}={lit}{t[last_end:]}"

    def set_model(self, value: str) -> None:
        """model="value": the keyword if written, else the positional first argument, else a new keyword."""
        lit = self._literal(value)
        for kname, _, _, vs, ve, _ in self.kwargs():
            if kname == "model":
                self.text = self.text[:vs] + lit + self.text[ve:]
                return
        base, call = self._call()
        if call.args:
            s, e = self._span(base, call.args[0])
            self.text = self.text[:s] + lit + self.text[e:]
            return
        self._set_kw("model", lit)

    def remove_flag(self, flag: str) -> bool:
        name, _ = kwarg_for(flag, "x")
        base, call = self._call()
        args = [*call.args, *[k for k in call.keywords]]
        for i, kw in enumerate(args):
            if isinstance(kw, ast.keyword) and kw.arg == name:
                s, e = self._span(base, kw)
                if i > 0:
                    s = self._span(base, args[i - 1])[1]
                elif i + 1 < len(args):
                    e = self._span(base, args[i + 1])[0]
                self.text = self.text[:s] + self.text[e:]
                return True
        return False

    def set_env(self, name: str, value: str) -> None:
        line = f"os.environ[{json.dumps(name)}] = {json.dumps(value)}"
        pat = re.compile(r"(?m)^([ \t]*)os\.environ\[[\"']" + re.escape(name) + r"[\"']\]\s*=.*$")
        if pat.search(self.text):
            self.text = pat.sub(lambda m: m.group(1) + line, self.text, count=1)
            return
        start = self.text.rfind("\n", 0, self._call()[0]) + 1
        indent = re.match(r"[ \t]*", self.text[start:]).group(0)
        add = ([] if re.search(r"(?m)^\s*import os\b", self.text) else [indent + "import os"]) + [indent + line]
        self.text = self.text[:start] + "\n".join(add) + "\n" + self.text[start:]
