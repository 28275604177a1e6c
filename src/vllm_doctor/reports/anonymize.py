"""Mask what should not leave the machine: paths, host names, IPs, user names, tokens, API keys.

The same value always gets the same placeholder, so a masked report still reads consistently.
"""
from __future__ import annotations

import getpass
import os
import socket

import regex

SECRET = regex.compile(r"\b(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_\-]{16,}|ghp_[A-Za-z0-9]{20,}|"
                       r"xox[bp]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})\b")
SECRET_ASSIGN = regex.compile(r"(?i)((?:--api-key|--hf-token|api_key|hf_token|HF_TOKEN|HUGGING_FACE_HUB_TOKEN|"
                              r"OPENAI_API_KEY|VLLM_API_KEY|Authorization:\s*Bearer|token)[\"']?\s*[=:]?\s*[\"']?)"
                              r"([^\s\"',}]{6,})")
IPV4 = regex.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
IPV6 = regex.compile(r"(?<![\w:])(?:[0-9a-fA-F]{1,4}:){3,7}[0-9a-fA-F]{1,4}(?![\w:])")
PATH = regex.compile(r"(?<![\w.:/-])(?:~|/)(?:[\w.@+-]+/)*[\w.@+-]+")
HOME_USER = regex.compile(r"/(?:home|Users)/([\w.-]+)")
NCCL_HOST = regex.compile(r"^([A-Za-z][\w.-]*):(\d+):(\d+) \[", regex.MULTILINE)
KEEP_PATHS = ("/dev/shm", "/dev/null", "/v1/", "/usr/bin/env")


class Anonymizer:
    def __init__(self) -> None:
        self._maps: dict[str, dict[str, str]] = {}
        self.hosts = {h for h in {socket.gethostname(), os.environ.get("HOSTNAME", "")} if len(h) > 2}
        self.users = {u for u in {_user(), os.environ.get("USER", ""), os.environ.get("LOGNAME", "")} if len(u) > 2}

    def _token(self, kind: str, value: str) -> str:
        table = self._maps.setdefault(kind, {})
        if value not in table:
            table[value] = f"<{kind}-{len(table) + 1}>"
        return table[value]

    def apply(self, text: str) -> str:
        for m in NCCL_HOST.finditer(text):
            self.hosts.add(m.group(1))
        for m in HOME_USER.finditer(text):
            self.users.add(m.group(1))
        text = SECRET.sub(lambda m: self._token("secret", m.group(0)), text)
        text = SECRET_ASSIGN.sub(lambda m: m.group(1) + self._token("secret", m.group(2)), text)
        text = IPV4.sub(lambda m: self._token("ip", m.group(0)), text)
        text = IPV6.sub(lambda m: self._token("ip", m.group(0)), text)
        text = PATH.sub(self._path, text)
        for host in sorted(self.hosts, key=len, reverse=True):
            text = regex.sub(rf"(?<![\w-]){regex.escape(host)}(?![\w-])", self._token("host", host), text)
        for user in sorted(self.users, key=len, reverse=True):
            text = regex.sub(rf"(?<![\w-]){regex.escape(user)}(?![\w-])", self._token("user", user), text)
        return text

    def _path(self, m) -> str:
        value = m.group(0)
        if value.startswith(KEEP_PATHS) or value.count("/") < 2 and not value.startswith("~"):
            return value
        # keep the file name: it often says what failed (custom_all_reduce.cuh, config.json)
        base = value.rsplit("/", 1)[-1]
        return f"{self._token('path', value.rsplit('/', 1)[0])}/{base}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""
