"""Mask what should not leave the machine: secrets, host names, IPs, e-mails, user names and paths.

Applied to the text the doctor writes (reports in every format, live notices), never to its input: the
diagnosis is made on the real log, only what is shown is masked. The same value always gets the same
placeholder (`<host-1>`, `<secret-2>`), so a masked report still reads; one `Anonymizer` per run keeps
the live notices and the final report consistent (`for_args`).

What must survive: model ids (meta-llama/Llama-3.1-8B-Instruct), Python names (vllm.engine.arg_utils),
file names (config.json), versions (0.6.3.post1), `cuda:0`, flag names. So a dotted name is a host only
with a host's suffix (a TLD, `.local`, `.internal`, `.svc.cluster.local`) or in a host's position
(`host:port`, after `@` or `://`, the NCCL `host:pid:tid [rank]` prefix, after `hostname=`/`MASTER_ADDR=`).
"""
from __future__ import annotations

import getpass
import os
import socket
from typing import Callable

import regex

# --------------------------------------------------------------------------- secrets by their own shape
_TOKEN_SHAPES = (r"hf_[A-Za-z0-9]{16,}", r"sk-ant-[A-Za-z0-9_\-]{16,}", r"sk-[A-Za-z0-9_\-]{16,}",
                 r"github_pat_[A-Za-z0-9_]{20,}", r"gh[pousr]_[A-Za-z0-9]{20,}", r"xox[abposr]-[A-Za-z0-9\-]{10,}",
                 r"(?:AKIA|ASIA)[0-9A-Z]{16}", r"AIza[0-9A-Za-z_\-]{30,}",
                 r"eyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}")     # a JWT
TOKEN = regex.compile(r"(?<![\w-])(?:" + "|".join(_TOKEN_SHAPES) + r")(?![\w-])")
# the same prefixes cut short by a report's `…`: the part shown is still part of the secret
TOKEN_CUT = regex.compile(r"(?<![\w-])(?:hf_|sk-|github_pat_|gh[pousr]_|xox[abposr]-|AKIA|ASIA|AIza|eyJ)"
                          r"[\w\-.]*(?=…)")
BEARER = regex.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/=\-]{6,})")

# --------------------------------------------------------------------------- secrets by their name
# key=value, key: value, "key": "value" (also JSON-escaped \"key\": \"value\"), HF_TOKEN=..., --api-key X
_KEYWORD = (r"(?:passw(?:or)?d|passphrase|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
            r"credentials?|auth(?:orization)?|cookie|[_-]key)(?:[_-](?:id|value))?")
_QUOTE = r"(?:\\?[\"'])"
_VALUE = r"(?:[^\s\"'\\,;&(){}\[\]<>|`]|\\(?![nrtu\"'\\/]))+"
ASSIGN = regex.compile(
    rf"(?i)(?<![\w.-])(?P<key>[\w.-]*?{_KEYWORD})(?![\w-])(?P<sep>{_QUOTE}?[ \t]*(?:=|:(?!//))[ \t]*)"
    rf"(?:(?P<q>{_QUOTE})(?P<quoted>(?:(?!(?P=q)).){{1,300}}?)(?P=q)|(?P<value>{_VALUE}))")
FLAG = regex.compile(rf"(?i)(?<![\w.-])(?P<key>--[\w-]*?{_KEYWORD})(?P<sep>[ \t]+)(?P<q>{_QUOTE})?"
                     rf"(?P<value>(?!-){_VALUE})")
# names that end like a secret's but hold none: a tokenizer's special tokens
_NOT_SECRET_KEY = regex.compile(r"(?i)(?:bos|eos|pad|unk|sep|cls|mask|special|additional_special)[_-]token$")
_BENIGN = regex.compile(r"(?i)none|null|nil|true|false|bearer|basic|\*+|x+|\.\.\.|…|\$\{?\w+\}?|<[^>]*>|"
                        r"<set|redacted")
URL_CREDS = regex.compile(r"(?i)\b(?P<scheme>[a-z][a-z0-9+.\-]*://)(?P<user>[^\s:/@\"'\\<>]+)"
                          r"(?::(?P<pw>[^\s/@\"'\\]*))?@")

# --------------------------------------------------------------------------- addresses
EMAIL = regex.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
_H = r"[0-9A-Fa-f]{1,4}"
_V4 = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}"
_V6 = "|".join((
    rf"(?:{_H}:){{7}}{_H}",
    rf"(?:{_H}:){{6}}{_V4}",
    rf"::(?:ffff(?::0{{1,4}})?:)?{_V4}",          # v4-mapped ::ffff:10.0.0.1
    rf"(?:{_H}:){{1,5}}:{_V4}",                   # 64:ff9b::10.0.0.1
    rf"(?:{_H}:){{1,6}}(?::{_H}){{1,6}}",         # compressed in the middle: 2001:db8::8a2e:370:7334
    rf"(?:{_H}:){{1,7}}:",                        # fe80::
    rf":(?::{_H}){{1,7}}",                        # ::1, ::ffff:a00:1
))
# start of an address: not inside a word or another address; or right after an interface name (NCCL's
# `Using [0]eth0:fe80::1%eth0<0>`, docker's `--add-host name:::1`)
IPV6 = regex.compile(rf"(?:(?<![\w.:])|(?<=(?<![\w.-])[A-Za-z][\w.-]{{0,100}}:))(?:{_V6})(?:%[\w.\-]+)?"
                     rf"(?![\w:]|\.\d)")
IPV4 = regex.compile(rf"(?<![\w.])(?:{_V4})(?![\w]|\.\d)")
MAC = regex.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![\w:])")
KEEP_IPS = frozenset({"0.0.0.0", "127.0.0.1", "::", "::1"})    # bind-all and loopback: nobody's address

# --------------------------------------------------------------------------- host names
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# TLDs a file extension or a Python attribute does not end with (no .py .cc .so .in .info .int .md .sh)
_TLDS = (r"com|net|org|io|ai|dev|cloud|edu|gov|mil|co|us|uk|de|fr|nl|eu|ru|cn|jp|kr|au|ca|ch|se|es|tech|"
         r"xyz|example|test|invalid")
FQDN = regex.compile(
    rf"(?<![\w.@/<-])(?:{_LABEL}\.)+(?:(?:svc\.)?cluster\.local|(?:{_TLDS})|"
    rf"(?:local|localdomain|internal|lan|corp|intranet|home))(?![\w-]|\.[A-Za-z0-9])")
_AMBIGUOUS_SUFFIX = ("local", "home", "lan", "corp", "intranet", "internal", "localdomain")
AWS_HOST = regex.compile(r"(?<![\w.-])ip-\d{1,3}(?:-\d{1,3}){3}(?:\.[\w.-]+)?(?![\w-])")
NCCL_HOST = regex.compile(r"(?<![\w.<-])([A-Za-z0-9][\w.-]*):(\d+):(\d+)(?= \[\d+\])")
URL_HOST = regex.compile(r"(?i)(?<=\b[a-z][a-z0-9+.\-]*://(?:[^\s/@]*@)?)([A-Za-z0-9][\w.-]*)")
# `kubectl logs --prefix` (`[pod/vllm-worker-0/vllm] …`) and the node story's `pod/vllm-worker-0`
POD = regex.compile(r"(?<=(?<![\w-])pod/)([A-Za-z0-9][\w.-]*)")
AT_HOST = regex.compile(r"(?<=[\w>]@)([A-Za-z0-9][\w-]*(?:\.[\w-]+)*)(?=[:\s/]|$)")   # user@host:~$ prompts
# `name:port`: a name with a digit or a hyphen (gpu-node-17:29500, node1:29500; not cuda:0, not a
# file:line like api_server.py:1034)
_FILE_EXT = frozenset("py pyc pyx pyi cc cpp cxx c h hpp cu cuh so json yaml yml toml txt log md sh rs go js ts "
                      "safetensors bin pt pth gguf onnx ini cfg".split())
HOST_PORT = regex.compile(r"(?<![\w.:/<-])([A-Za-z](?:[A-Za-z0-9-]*[0-9-][A-Za-z0-9-]*)?(?:\.[A-Za-z0-9-]+)*)"
                          r":(\d{2,5})(?![\d:]|\.\d)")
# a host named by its key: MASTER_ADDR=trainer-head-2, hostname: gpu-node-17, --host vllm-0 (and `node X`,
# `host X` in prose only when X looks like a machine's name: "one node NCCL", "host RAM" are words)
HOST_KEY = regex.compile(r"(?i)(?<![\w.-])(?P<key>(?:--)?(?:host_?name|node_?name|master[_-]addr|dist[_-]init[_-]addr|"
                         r"vllm_host_ip|host[_-]ip|node|host))(?P<sep>\s*[=:]\s*|[ \t]+)[\"']?"
                         r"(?P<name>[A-Za-z0-9][\w.-]*[A-Za-z0-9])")
KEEP_HOSTS = frozenset({"localhost", "localhost.localdomain", "none", "null", "true", "false", "auto", "host",
                        "hostname", "ip", "addr", "address"})       # the last ones: placeholders in our own texts
# public sites a report may point at: naming them says nothing about the user
PUBLIC_DOMAINS = ("huggingface.co", "hf.co", "github.com", "githubusercontent.com", "pytorch.org", "vllm.ai",
                  "pypi.org", "python.org", "nvidia.com", "docker.io", "docker.com", "nvcr.io", "ghcr.io",
                  "quay.io", "ray.io", "readthedocs.io", "modelscope.cn", "anaconda.org", "conda.io")
# words a host or user may be called that are everywhere in a report: masked in place, never everywhere
COMMON_NAMES = frozenset({"vllm", "localhost", "ray", "head", "worker", "node", "server", "host", "master",
                          "main", "gpu", "cuda", "docker", "container", "python", "root", "user", "admin",
                          "ubuntu", "runner", "nobody", "default", "model", "models", "app", "api", "none"})

# --------------------------------------------------------------------------- paths
PATH = regex.compile(r"(?<![\w.:/<>~-])(?:~/|/)(?:[\w.@+-]+/)*[\w.@+-]+")
HOME_USER = regex.compile(r"(?<=/(?:home|Users)/)([^/\s:\"'\\<>]+)")
WIN_USER = regex.compile(r"(?i)(?<=\b[A-Z]:(?:\\\\|\\|/)(?:Users|Documents and Settings)(?:\\\\|\\|/))"
                         r"([^\\/\s:\"'*?<>|]+)")
KEEP_PATHS = ("/dev/shm", "/dev/null", "/v1/", "/usr/bin/env", "~/.cache/")     # the same on every machine
PLACEHOLDER = regex.compile(r"<[a-z]+-\d+>")


class Anonymizer:
    def __init__(self) -> None:
        self._maps: dict[str, dict[str, str]] = {}
        self.hosts = {h for h in {socket.gethostname(), os.environ.get("HOSTNAME", "")} if _maskable(h)}
        self.users = {u for u in {_user(), os.environ.get("USER", ""), os.environ.get("LOGNAME", "")}
                      if _maskable(u)}
        self.secrets: set[str] = set()          # values found by name: masked wherever they show again
        self.pods: set[str] = set()

    def know(self, diagnosis) -> None:
        """The names the diagnosis collected (log.hostnames, the nodes of its story, a cluster's hosts):
        masked wherever they appear, also where no shape or position says what they are."""
        for run in [diagnosis, *getattr(diagnosis, "earlier", [])]:
            self.know_facts(run.facts)
            self._know_names(getattr(getattr(run, "nodes", None), "nodes", None) or [])

    def know_facts(self, facts) -> None:
        """The host names among the facts: the log's, this machine's, a cluster snapshot's nodes'."""
        hostname = facts.get("net.hostname")
        self._know_names([*(facts.get("log.hostnames") or []), *([hostname] if isinstance(hostname, str) else []),
                          *(n.get("hostname") for n in facts.get("cluster.nodes") or [] if isinstance(n, dict))])

    def _know_names(self, names) -> None:
        from vllm_doctor.events.nodes import DRIVER_LABEL

        for name in names:
            name = str(name or "")
            if name == DRIVER_LABEL:                  # the story's own words, no machine's name
                continue
            if name.startswith("pod/"):
                self._add_pod(name[4:])
            elif not (IPV4.fullmatch(name) or IPV6.fullmatch(name)):
                self._add_host(name)

    def _token(self, kind: str, value: str) -> str:
        table = self._maps.setdefault(kind, {})
        if value not in table:
            table[value] = f"<{kind}-{len(table) + 1}>"
        return table[value]

    def apply(self, text: str) -> str:
        self._learn(text)
        text = URL_CREDS.sub(self._url_creds, text)
        text = TOKEN.sub(lambda m: self._token("secret", m.group(0)), text)
        text = TOKEN_CUT.sub(lambda m: self._token("secret", m.group(0)), text)
        text = BEARER.sub(lambda m: m.group(1) + self._secret(m.group(2)), text)
        text = ASSIGN.sub(self._assign, text)
        text = FLAG.sub(self._assign, text)
        text = EMAIL.sub(lambda m: self._token("email", m.group(0)), text)
        text = IPV6.sub(self._ip, text)
        text = IPV4.sub(self._ip, text)
        text = MAC.sub(lambda m: self._token("mac", m.group(0)), text)
        text = POD.sub(lambda m: self._pod(m.group(1)), text)
        text = self._hosts(text)
        text = PATH.sub(self._path, text)
        text = HOME_USER.sub(lambda m: self._user_name(m.group(1)), text)
        text = WIN_USER.sub(lambda m: self._user_name(m.group(1)), text)
        text = self._everywhere(text)
        return self._cut_prefixes(text)

    # ------------------------------------------------------------------ what to learn before masking
    def _learn(self, text: str) -> None:
        """Names seen in a host's or a user's position: masked wherever they appear (a facts list, a table)."""
        for m in NCCL_HOST.finditer(text):
            self._add_host(m.group(1))
        for m in HOST_KEY.finditer(text):
            if _named_host(m):
                self._add_host(m.group("name"))
        for m in AT_HOST.finditer(text):
            self._add_host(m.group(1))
        for m in POD.finditer(text):
            self._add_pod(m.group(1))
        for m in HOME_USER.finditer(text):
            self._add_user(m.group(1))
        for m in WIN_USER.finditer(text):
            self._add_user(m.group(1))

    def _add_host(self, name: str) -> None:
        if _maskable(name) and not IPV4.fullmatch(name) and not PLACEHOLDER.search(name) \
                and not _public(name) and not name.isdigit():
            self.hosts.add(name)

    def _add_pod(self, name: str) -> None:
        if _maskable(name) and not PLACEHOLDER.search(name):
            self.pods.add(name)

    def _pod(self, name: str) -> str:
        if PLACEHOLDER.search(name) or not _maskable(name):
            return name
        self._add_pod(name)
        return self._token("pod", name)

    def _add_user(self, name: str) -> None:
        if _maskable(name) and not PLACEHOLDER.search(name):
            self.users.add(name)

    # ------------------------------------------------------------------ replacements
    def _secret(self, value: str) -> str:
        if PLACEHOLDER.fullmatch(value) or _BENIGN.fullmatch(value):
            return value
        for known in self._maps.get("secret", {}) if len(value) >= 6 else ():
            if known.startswith(value):     # the start of one shown in full elsewhere: a table cut it short
                return self._token("secret", known)
        if len(value) >= 6:
            self.secrets.add(value)
        return self._token("secret", value)

    def _assign(self, m) -> str:
        group = "quoted" if m.groupdict().get("quoted") is not None else "value"
        value = m.group(group)
        if _NOT_SECRET_KEY.search(m.group("key")) or PLACEHOLDER.search(value) or _BENIGN.fullmatch(value) \
                or value.startswith("-"):
            return m.group(0)
        if group == "value" and value.isdigit() and ":" in m.group("sep"):
            return m.group(0)               # "bytes per token: 2048" is prose, not a credential
        start, end = m.start(group) - m.start(), m.end(group) - m.start()
        return m.group(0)[:start] + self._secret(value) + m.group(0)[end:]

    def _url_creds(self, m) -> str:
        pw = m.group("pw")
        user = m.group("user") if PLACEHOLDER.fullmatch(m.group("user")) else self._token("user", m.group("user"))
        if len(m.group("user")) >= 4:
            self.secrets.add(m.group("user"))
        return m.group("scheme") + user + (f":{self._secret(pw)}" if pw else "") + "@"

    def _ip(self, m) -> str:
        value = m.group(0)
        if value in KEEP_IPS or value.split("%")[0] in KEEP_IPS or value.startswith("0."):
            return value                    # 0.x.x.x is nobody's address, and 0.10.1.1 is a vLLM version
        if "::" in value and "." not in value and sum(c not in ":" for c in value.split("%")[0]) < 4:
            return value                    # `1::2`, `x[::2]`: a slice, not an address
        return self._token("ip", value)

    def _host(self, name: str) -> str:
        if name.lower() in KEEP_HOSTS or PLACEHOLDER.search(name) or _public(name):
            return name
        if _maskable(name) and not name.isdigit():
            self.hosts.add(name)
        return self._token("host", name)

    def _hosts(self, text: str) -> str:
        text = URL_HOST.sub(lambda m: self._host(m.group(1)), text)
        text = NCCL_HOST.sub(lambda m: f"{self._host(m.group(1))}:{m.group(2)}:{m.group(3)}", text)
        text = AWS_HOST.sub(lambda m: self._host(m.group(0)), text)
        text = FQDN.sub(self._fqdn, text)
        text = AT_HOST.sub(lambda m: self._host(m.group(1)), text)
        text = HOST_PORT.sub(self._host_port, text)
        return text

    def _fqdn(self, m) -> str:
        name = m.group(0)
        labels = name.split(".")
        if not any(c.isalpha() for c in "".join(labels[:-1])):
            return name                     # 2.5.0.dev: a version
        if labels[-1] in _AMBIGUOUS_SUFFIX and len(labels) == 2 and not regex.search(r"[\d-]", labels[0]):
            return name                     # threading.local, Path.home: Python, not a host
        return self._host(name)

    def _host_port(self, m) -> str:
        name = m.group(1)
        if "." in name and name.rsplit(".", 1)[1].lower() in _FILE_EXT:
            return m.group(0)               # a file and a line number
        if "." not in name and not regex.search(r"[\d-]", name):
            return m.group(0)
        return f"{self._host(name)}:{m.group(2)}"

    def _user_name(self, name: str) -> str:
        if PLACEHOLDER.fullmatch(name):
            return name
        self._add_user(name)
        return self._token("user", name)

    def _path(self, m) -> str:
        value = m.group(0)
        if HOME_USER.search(value):         # a home directory keeps its shape: /home/<user-1>/models/x
            return HOME_USER.sub(lambda u: self._user_name(u.group(1)), value)
        if value.startswith(KEEP_PATHS) or value.count("/") < 2 and not value.startswith("~"):
            return value
        # keep the file name: it often says what failed (custom_all_reduce.cuh, config.json)
        base = value.rsplit("/", 1)[-1]
        return f"{self._token('path', value.rsplit('/', 1)[0])}/{base}"

    def _everywhere(self, text: str) -> str:
        """Learned names and secrets wherever they appear again, longest first."""
        for kind, values in (("secret", self.secrets), ("pod", self.pods), ("host", self.hosts), ("user", self.users)):
            for value in sorted(values, key=len, reverse=True):
                if kind != "secret" and value.lower() in COMMON_NAMES:
                    continue
                text = regex.sub(rf"(?<![\w-]){regex.escape(value)}(?![\w-])",
                                 lambda _m, v=value, k=kind: self._token(k, v), text)
        return text

    def _cut_prefixes(self, text: str) -> str:
        """A value a table or a line cut short leaves its start behind (`HF_TOKEN=hf_QmXk`): mask it."""
        known = [(k, v) for k, table in self._maps.items() if k != "path" for v in table if len(v) >= 8]
        if not known:
            return text

        def cut(m) -> str:
            run = m.group(0)
            for i in range(len(run)):
                if i and run[i - 1].isalnum():
                    continue
                tail = run[i:]
                if len(tail) < 4:
                    break
                if tail.lower() in COMMON_NAMES:
                    continue                # `-c vllm` at a line's end is no cut `vllm-worker-0`
                for kind, value in known:
                    if value.startswith(tail) and value != tail:
                        return run[:i] + self._token(kind, value)
            return run

        return regex.sub(r"[^\s<>]{4,}(?=…|[ \t]{2}|[ \t]*$)", cut, text, flags=regex.MULTILINE)


def for_args(args, diagnosis=None, facts=None) -> Callable[[str], str] | None:
    """The masking function of this run (one Anonymizer for its notices and its report), None without
    --anonymize; given the diagnosis (or facts), it also knows the names they collected."""
    if not getattr(args, "anonymize", False):
        return None
    anonymizer = getattr(args, "_anonymizer", None)
    if anonymizer is None:
        anonymizer = Anonymizer()
        try:
            args._anonymizer = anonymizer
        except AttributeError:
            pass
    if diagnosis is not None:
        anonymizer.know(diagnosis)
    if facts is not None:
        anonymizer.know_facts(facts)
    return anonymizer.apply


JSON_HOST_KEYS = frozenset({"hostname", "host", "hostnames", "node_name", "nodename", "log.hostnames"})


def mask_json(text: str, mask: Callable[[str], str]) -> str:
    """A JSON report masked string by string: masking its text would reach into escapes (`\\n` then a host
    name becomes `\\<host-1>`, which no parser reads). Keys are masked too (facts may be keyed by host)."""
    import json

    def walk(value, key: str = ""):
        if isinstance(value, str):
            if key.lower() in JSON_HOST_KEYS and value:     # a bare name that only its key calls a host
                return mask(f"hostname={value}").split("=", 1)[1]
            return mask(value)
        if isinstance(value, list):
            return [walk(v, key) for v in value]
        if isinstance(value, dict):
            # a fact's `value` is named by its fact key: {"log.hostnames": {"value": [...]}}
            return {mask(k): walk(v, key if k == "value" else k) for k, v in value.items()}
        return value

    return json.dumps(walk(json.loads(text)), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _named_host(m) -> bool:
    key, name, sep = m.group("key").lower(), m.group("name"), m.group("sep")
    if key.startswith("--") or ("=" in sep and key not in ("node", "host")):
        return True                         # MASTER_ADDR=x, hostname=x, --host x: x is a host
    if sep.strip() and key not in ("node", "host"):
        return True                         # hostname: x
    # `node x`, `host: x`, `VLLM_HOST_IP must be set`: prose unless x looks like a machine's name
    return key in ("node", "host", "hostname") and _machine_like(name)


def _machine_like(name: str) -> bool:
    return bool(regex.search(r"[A-Za-z]", name) and regex.search(r"[\d-]", name))


def _maskable(name: str) -> bool:
    return len(name) > 2 and name.lower() not in KEEP_HOSTS


def _public(name: str) -> bool:
    name = name.lower().rstrip(".")
    return any(name == d or name.endswith("." + d) for d in PUBLIC_DOMAINS)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""
