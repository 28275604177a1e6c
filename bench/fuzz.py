"""Mutation fuzzer: the corpus's real logs, damaged in the ways logs really get damaged, through the CLI.

    python bench/fuzz.py --count 2000 --seed 1            # the full run (minutes on 2 cores)
    python bench/fuzz.py --seed 1 --index 417 --save DIR  # one input again: written to DIR, with the
                                                          # shell commands that reproduce it
Every input is made from a seeded random.Random (seed and index: `seed:index` names it) out of the logs
of logs_corpus/ (every case folder), by one mutation family (FAMILIES; `combo` stacks several). Each input
goes through the CLI three ways: a file argument, `-` (standard input as a saved log) and the pipe (no
argument, standard input a pipe), the report format rotating over text/json/markdown so every mode x
format pair gets a third of the inputs. Checked for every run:

* no Python traceback on stderr (nor an exception swallowed into `error: SomeError: ...` or the pipe's
  `diagnosis stopped: internal error`, counted apart: each hides a bug),
* the exit code is 0, 1 or 2, and 2 comes with a one-line `vllm-doctor: ` error,
* pipe mode: stdout holds exactly the bytes of stdin,
* --format json: the document parses strictly (UTF-8, no NaN/Infinity, no lone surrogate escapes),
* no run takes longer than --timeout seconds (a hang).

The CLI runs in-process for speed: each worker process imports the package and loads the catalog once,
then forks one child per run, which points descriptors 0/1/2 at a pipe or file and temporary files and
calls vllm_doctor.cli.main.main (about 20x cheaper than a fresh interpreter). `--fresh` runs the real
`python -m vllm_doctor` instead, to confirm a finding.
"""
from __future__ import annotations

import argparse
import bz2
import codecs
import gzip
import io
import json
import lzma
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "logs_corpus"
MODES = ("file", "dash", "pipe")
FORMATS = ("text", "json", "markdown")
# Extra options rotated over the runs (always with --no-live: the result must not depend on this machine).
EXTRA_OPTIONS = ([], [], ["-v"], ["-vv"], ["--anonymize"], ["--all-runs"], ["--cmd"])
HUGE_DIGITS = 5000          # past Python's int() limit of 4300 digits
MIB = 1 << 20


# ----------------------------------------------------------------------------------------- the corpus

@dataclass(frozen=True)
class Corpus:
    logs: tuple[Path, ...]
    commands: tuple[str, ...]      # the `command` of every case in the cases.toml files


def load_corpus(root: Path = CORPUS) -> Corpus:
    """Every *.log of a case folder (a folder with cases.toml), and the cases' launch commands."""
    logs: set[Path] = set()
    commands: list[str] = []
    for cases in sorted(root.rglob("cases.toml")):
        logs.update(cases.parent.rglob("*.log"))
        with open(cases, "rb") as f:
            for case in tomllib.load(f).get("case", []):
                if isinstance(case.get("command"), str):
                    commands.append(case["command"])
    return Corpus(tuple(sorted(logs)), tuple(commands))


# ----------------------------------------------------------------------------------------- mutators
# Each takes (rng, data, corpus) and returns new bytes. They damage real logs the ways real logs get
# damaged: copied while written (truncation), wrapped by a platform, re-encoded, piped through tools
# that colour or re-time them, or fed something hostile on purpose.

def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [data]


def _real_line(rng: random.Random, corpus: Corpus) -> bytes:
    """One line of a random corpus log (the material every insertion is made of)."""
    lines = _lines(rng.choice(corpus.logs).read_bytes())
    line = rng.choice(lines)
    return line if line.endswith(b"\n") else line + b"\n"


def _insert_lines(rng: random.Random, data: bytes, new: list[bytes]) -> bytes:
    lines = _lines(data)
    at = rng.randint(0, len(lines))
    return b"".join(lines[:at] + new + lines[at:])


def m_flip(rng, data, corpus):
    buf = bytearray(data)
    for _ in range(rng.randint(1, 32)):
        if buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(256)
    return bytes(buf)


def m_truncate(rng, data, corpus):
    if not data:
        return data
    kind = rng.choice(("anywhere", "mid-line", "mid-utf8"))
    if kind == "mid-utf8":
        leads = [i for i, b in enumerate(data) if b >= 0xC2]      # the first byte of a multi-byte character
        if not leads:                                             # none in this log: add one, cut inside it
            at = rng.randrange(len(data))
            data = data[:at] + "█…".encode() + data[at:]
            leads = [at, at + 3]
        return data[:rng.choice(leads) + 1]
    if kind == "mid-line":
        inner = [i for i in range(1, len(data)) if data[i - 1] != 0x0A][:: max(1, len(data) // 500)]
        return data[:rng.choice(inner)] if inner else data[:1]
    return data[:rng.randrange(len(data))]


def m_lines(rng, data, corpus):
    lines = _lines(data)
    for _ in range(rng.randint(1, 12)):
        op = rng.choice(("dup", "dup-many", "delete", "swap"))
        i = rng.randrange(len(lines))
        if op == "dup":
            lines.insert(i, lines[i])
        elif op == "dup-many":                       # a crash loop or a warning flood
            lines[i:i] = [lines[i]] * rng.choice((100, 1000, 5000))
        elif op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def m_splice(rng, data, corpus):
    other = rng.choice(corpus.logs).read_bytes()
    if rng.random() < 0.5:                          # the head of one log, the tail of another
        return data[:rng.randint(0, len(data))] + other[rng.randint(0, len(other)):]
    a, b = _lines(data), _lines(other)              # two processes writing into one file, interleaved
    out: list[bytes] = []
    while a or b:
        src = a if (a and (not b or rng.random() < 0.5)) else b
        out.append(src.pop(0))
    return b"".join(out)


_DIGITS = re.compile(rb"\d+")


def _huge(rng: random.Random) -> bytes:
    digit = rng.choice(b"1779")
    return bytes([digit]) * HUGE_DIGITS if rng.random() < 0.5 else \
        (str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(HUGE_DIGITS - 1))).encode()


def m_huge_number(rng, data, corpus):
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("digit-run", "rank", "pid", "flag"))
        if kind == "digit-run":
            runs = list(_DIGITS.finditer(data))
            if runs:
                m = rng.choice(runs)
                data = data[:m.start()] + _huge(rng) + data[m.end():]
                continue
        line = _real_line(rng, corpus)
        if kind == "rank":                         # `[rank0]: ...` as torch.distributed prints it
            new = b"[rank" + _huge(rng) + b"]: " + line
        elif kind == "pid":                        # `(EngineCore_DP0 pid=123) ...` as vLLM prints it
            new = b"(EngineCore_DP0 pid=" + _huge(rng) + b") " + line
        else:                                      # a logged command line with a huge flag value
            flag = rng.choice((b"--tensor-parallel-size", b"-tp", b"--max-model-len", b"--gpu-memory-utilization",
                               b"--pipeline-parallel-size", b"--port"))
            new = b"$ vllm serve /models/m " + flag + b" " + _huge(rng) + b"\n"
        data = _insert_lines(rng, data, [new])
    return data


def m_long_line(rng, data, corpus):
    kind = rng.choice(("x", "real-repeated", "padded-fatal", "no-newline-at-end"))
    line = _real_line(rng, corpus).rstrip(b"\n")
    if kind == "x":
        long = b"x" * MIB
    elif kind == "real-repeated":
        long = (line + b" ") * (MIB // (len(line) + 1) + 1)
    elif kind == "padded-fatal":                     # a real line behind 1 MiB of spaces (a wide paste)
        long = b" " * MIB + line
    else:
        return data + long_tail(line)
    return _insert_lines(rng, data, [long[: MIB + len(line)] + b"\n"])


def long_tail(line: bytes) -> bytes:
    return (line + b" ") * (MIB // (len(line) + 1) + 1)


INVALID_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf", b"\x80",
                b"\xe2\x82", b"\xf0\x9f\x98")


def m_invalid_utf8(rng, data, corpus):
    buf = bytearray(data)
    for _ in range(rng.randint(1, 40)):
        at = rng.randint(0, len(buf))
        buf[at:at] = rng.choice(INVALID_UTF8)
    return bytes(buf)


def m_nul(rng, data, corpus):
    buf = bytearray(data)
    for _ in range(rng.randint(1, 10)):
        at = rng.randint(0, len(buf))
        buf[at:at] = b"\x00" * rng.choice((1, 1, 4, 1000, 70000))
    return bytes(buf)


def m_newlines(rng, data, corpus):
    kind = rng.choice(("crlf", "cr", "mixed", "progress"))
    if kind == "crlf":
        return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    if kind == "cr":                                  # old Mac endings: the whole log is one "line"
        return data.replace(b"\n", b"\r")
    if kind == "mixed":
        return b"".join(line.replace(b"\n", rng.choice((b"\n", b"\r\n", b"\r", b"\n\r", b"\r\r\n")))
                        for line in _lines(data))
    frames = b"".join(b"Loading safetensors checkpoint shards: %3d%% Completed\r" % p for p in range(0, 101, 5))
    return _insert_lines(rng, data, [frames * rng.choice((1, 50)) + b"\n"])


ANSI_CODES = (b"\x1b[31m", b"\x1b[0m", b"\x1b[1;33m", b"\x1b[2K", b"\x1b[1A", b"\x1b[?25l", b"\x1b]0;title\x07",
              b"\x1b]8;;https://docs.vllm.ai\x1b\\", b"\x1b]8;;\x1b\\", b"\x1b(B", b"\x1b[38;5;208m", b"\x1b[",
              b"\x1b]", b"\x1b")


def m_ansi(rng, data, corpus):
    lines = _lines(data)
    for _ in range(rng.randint(1, 60)):
        i = rng.randrange(len(lines))
        line = lines[i]
        at = rng.randint(0, len(line))
        lines[i] = line[:at] + rng.choice(ANSI_CODES) + line[at:]
    return b"".join(lines)


PREFIXES = (b"2024-05-01T12:00:00.123456789Z stdout F ",      # kubectl logs / CRI
            b"vllm-1  | ",                                     # docker compose logs
            b"May 01 12:00:00 gpu-node-3 vllm[1234]: ")        # journalctl


def m_prefix(rng, data, corpus):
    kind = rng.randrange(len(PREFIXES) + 1)
    if kind < len(PREFIXES):
        return b"".join(PREFIXES[kind] + line for line in _lines(data))
    return b"".join(rng.choice(PREFIXES) * rng.randint(1, 2) + line for line in _lines(data))


FRAME_LINE = b'  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line %d, in create_engine_config\n'


def m_traceback(rng, data, corpus):
    """A `Traceback (most recent call last):` that never gets its exception line, then many lines."""
    new = [b"Traceback (most recent call last):\n"]
    for n in range(rng.choice((100, 1000, 5000))):
        new.append(FRAME_LINE % n if rng.random() < 0.5 else b"    " + _real_line(rng, corpus))
    if rng.random() < 0.3:
        new = [b"(EngineCore_DP0 pid=42) ERROR 12-01 00:37:45 [core.py:1510] " + line for line in new]
    return _insert_lines(rng, data, new)


HOMOGLYPHS = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "y": "у", "A": "Α", "B": "Β", "E": "Ε",
              "H": "Η", "T": "Τ", "0": "０", "1": "¹", "2": "²", "3": "٣", "4": "४", "-": "‐", " ": "\u00a0"}
ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u202e", "\u00ad")


def m_homoglyph(rng, data, corpus):
    text = data.decode("utf-8", "surrogateescape")
    chars = list(text)
    for _ in range(rng.randint(1, 200)):
        if not chars:
            break
        i = rng.randrange(len(chars))
        if rng.random() < 0.5 and chars[i] in HOMOGLYPHS:
            chars[i] = HOMOGLYPHS[chars[i]]
        else:
            chars.insert(i, rng.choice(ZERO_WIDTH))
    return "".join(chars).encode("utf-8", "surrogateescape")


def m_encoding(rng, data, corpus):
    kind = rng.choice(("gzip", "gzip-cut", "gzip-twice", "bz2", "xz", "utf-16", "utf-16-be", "utf-16-nobom",
                       "utf-32", "utf-8-bom"))
    if kind == "gzip":
        return gzip.compress(data, mtime=0)
    if kind == "gzip-cut":
        packed = gzip.compress(data, mtime=0)
        return packed[:rng.randint(2, max(2, len(packed) - 1))]
    if kind == "gzip-twice":
        return gzip.compress(data, mtime=0) + gzip.compress(data[: len(data) // 2], mtime=0)
    if kind == "bz2":
        return bz2.compress(data)
    if kind == "xz":
        return lzma.compress(data)
    text = data.decode("utf-8", "replace")
    if kind == "utf-16":
        return codecs.BOM_UTF16_LE + text.encode("utf-16-le")
    if kind == "utf-16-be":
        return codecs.BOM_UTF16_BE + text.encode("utf-16-be")
    if kind == "utf-16-nobom":
        return text.encode("utf-16-le")
    if kind == "utf-32":
        return codecs.BOM_UTF32_LE + text.encode("utf-32-le")
    return codecs.BOM_UTF8 + data


# What a report writer must print literally: Rich markup and emoji codes, markdown fences, table bars and
# HTML, shell expansions (a report's command is pasted into a shell).
MARKUP = (b"[/x]", b"[bold]", b"[red]", b"[/]", b"[link=file:///etc]", b":smile:", b":warning:", b"```", b"````sh",
          b"`", b"|", b"<details>", b"</details>", b"<!--", b"$(id)", b"${HOME}", b"'\"", b"\\", b"\\\n")
_NAMES = re.compile(rb"/models/|'model': '|--model |vllm serve |File \"|\.log|\.py")


def m_markup(rng, data, corpus):
    """Markup inside the names the report repeats (model paths, files, commands) and anywhere in lines."""
    names = list(_NAMES.finditer(data))
    buf = bytearray(data)
    for _ in range(rng.randint(1, 12)):
        token = rng.choice(MARKUP)
        at = rng.choice(names).end() if names and rng.random() < 0.7 else rng.randint(0, len(buf))
        buf[at:at] = token
        names = list(_NAMES.finditer(bytes(buf)))
    return bytes(buf)


def m_combo(rng, data, corpus):
    for name in rng.sample([n for n in FAMILIES if n not in ("combo", "encoding")], rng.randint(2, 3)):
        data = FAMILIES[name](rng, data, corpus)
    if rng.random() < 0.2:
        data = m_encoding(rng, data, corpus)
    return data


Mutator = Callable[[random.Random, bytes, Corpus], bytes]
FAMILIES: dict[str, Mutator] = {
    "flip": m_flip, "truncate": m_truncate, "lines": m_lines, "splice": m_splice, "huge_number": m_huge_number,
    "long_line": m_long_line, "invalid_utf8": m_invalid_utf8, "nul": m_nul, "newlines": m_newlines,
    "ansi": m_ansi, "prefix": m_prefix, "traceback": m_traceback, "homoglyph": m_homoglyph,
    "encoding": m_encoding, "markup": m_markup, "combo": m_combo,
}


def mutate(rng: random.Random, data: bytes, family: str, corpus: Corpus) -> bytes:
    """`data` damaged by one family's mutator (FAMILIES), drawing every choice from `rng`."""
    return FAMILIES[family](rng, data, corpus)


# ----------------------------------------------------------------------------------------- inputs

@dataclass
class FuzzInput:
    seed: int
    index: int
    family: str
    base: str                  # the corpus log it was made from, relative to the repository
    data: bytes
    runs: list[tuple[str, str, list[str], bool]]   # (mode, format, extra options, stdin is a pipe)

    @property
    def name(self) -> str:
        return f"{self.seed}:{self.index}"

    @property
    def suffix(self) -> str:
        return ".log.gz" if self.data[:2] == b"\x1f\x8b" and self.index % 2 else ".log"


def make_input(seed: int, index: int, corpus: Corpus) -> FuzzInput:
    """Input `index` of run `seed`: the same bytes and runs on every machine and every call."""
    rng = random.Random(f"vllm-doctor-fuzz:{seed}:{index}")
    families = list(FAMILIES)
    family = families[index % len(families)]      # every family gets its share
    base = rng.choice(corpus.logs)
    data = mutate(rng, base.read_bytes(), family, corpus)
    runs = []
    for m, mode in enumerate(MODES):
        fmt = FORMATS[(index // len(families) + m) % len(FORMATS)]
        extra = list(rng.choice(EXTRA_OPTIONS))
        if extra == ["--cmd"]:
            extra.append(rng.choice(corpus.commands))
        runs.append((mode, fmt, extra, mode == "pipe" or rng.random() < 0.5))
    return FuzzInput(seed, index, family, str(base.relative_to(ROOT)), data, runs)


def argv_for(mode: str, fmt: str, extra: list[str], path: str) -> list[str]:
    argv = ["--no-live", "--format", fmt, *extra]
    if mode == "file":
        argv.append(path)
    elif mode == "dash":
        argv.append("-")
    return argv


# ----------------------------------------------------------------------------------------- running

@dataclass
class Outcome:
    rc: int
    stdout: bytes
    stderr: bytes
    wall: float
    crashed: str = ""          # the traceback of an exception that escaped main() (in-process runs)
    hung: bool = False


def _std_streams() -> tuple[tuple[str, str], ...]:
    """(encoding, errors) of a fresh interpreter's stdin, stdout and stderr (under pytest too)."""
    return tuple((getattr(s, "encoding", None) or "utf-8", getattr(s, "errors", None) or "strict")
                 for s in (sys.__stdin__, sys.__stdout__, sys.__stderr__))


STREAMS = _std_streams()


def prepare() -> None:
    """Import the CLI and what every sub-command imports first, so that forks start with them."""
    import vllm_doctor.checks.preflight  # noqa: F401
    import vllm_doctor.cli.main  # noqa: F401
    import vllm_doctor.cli.pipe  # noqa: F401
    import vllm_doctor.cli.stdin  # noqa: F401
    import vllm_doctor.diagnosis.saved  # noqa: F401
    import vllm_doctor.reports.emit  # noqa: F401


def warm() -> None:
    """What a worker does once, before its forks: import the CLI, load and compile the catalog."""
    os.environ.setdefault("VLLM_DOCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="vllm-doctor-fuzz-cache-"))
    prepare()
    from vllm_doctor.cli.main import main

    # one diagnosis per format: the lazily compiled patterns, indexes and report modules are then
    # ready in every fork, as they are after the first line in a fresh process
    saved = sys.stdout
    try:
        for fmt in FORMATS:
            with open(os.devnull, "w") as sys.stdout:
                main(["--no-live", "--format", fmt, str(CORPUS / "parallel" / "vicuna13b-tp3.log")])
    finally:
        sys.stdout = saved


def _child(argv: list[str], stdin_fd: int, out_fd: int, err_fd: int, crash_fd: int, cwd: str,
           env: dict[str, str] | None) -> None:
    """In the forked child: become `vllm-doctor ARGV` with these descriptors; never returns."""
    rc = 1
    try:
        os.dup2(stdin_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (stdin_fd, out_fd, err_fd):
            if fd > 2:
                os.close(fd)
        (ie, ierr), (oe, oerr), (ee, eerr) = STREAMS
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=ie, errors=ierr)
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding=oe, errors=oerr)
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding=ee, errors=eerr,
                                      line_buffering=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)      # as the interpreter sets it
        os.chdir(cwd)
        os.environ.update(env or {})
        os.environ["NO_COLOR"] = "1"
        os.environ.pop("FORCE_COLOR", None)
        sys.argv = ["vllm-doctor", *argv]
        from vllm_doctor.cli.main import main

        try:
            rc = main(argv)
        except SystemExit as exc:
            code = exc.code
            rc = code if isinstance(code, int) else (0 if code is None else 1)
            if not isinstance(code, int) and code is not None:
                print(code, file=sys.stderr)
        except BaseException:
            import traceback

            text = traceback.format_exc()
            sys.stderr.write(text)
            os.write(crash_fd, text.encode("utf-8", "replace"))
            rc = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    finally:
        os._exit(rc if isinstance(rc, int) else 1)


def run_forked(argv: list[str], stdin: bytes | None, stdin_pipe: bool, cwd: str, timeout: float,
               env: dict[str, str] | None = None) -> Outcome:
    """`vllm-doctor ARGV` in a forked child of this (warmed) process; stdin from a pipe fed `stdin`, a
    regular file holding it, or /dev/null (None); `env`: variables set in the child only."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as crash:
        writer = None
        if stdin is not None and stdin_pipe:
            stdin_fd, writer = os.pipe()
        elif stdin is not None:
            spool = tempfile.TemporaryFile()
            spool.write(stdin)
            spool.flush()
            spool.seek(0)
            stdin_fd = os.dup(spool.fileno())
            spool.close()
        else:
            stdin_fd = os.open(os.devnull, os.O_RDONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            if writer is not None:
                os.close(writer)
            _child(argv, stdin_fd, out.fileno(), err.fileno(), crash.fileno(), cwd, env)
        os.close(stdin_fd)
        deadline = start + timeout
        hung = False
        if writer is not None:
            hung = not _feed(writer, stdin, deadline)
        status = _wait(pid, deadline)
        if status is None:
            hung = True
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        wall = time.monotonic() - start
        rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        crash.seek(0)
        return Outcome(rc, out.read(), err.read(), wall, crash.read().decode("utf-8", "replace"), hung)


def _feed(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of `data` into the pipe, then close it; False when the reader stalled past the deadline."""
    view = memoryview(data)
    os.set_blocking(fd, False)
    try:
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _, ready, _ = select.select([], [fd], [], left)
            if not ready:
                continue
            try:
                view = view[os.write(fd, view[: 1 << 16]):]
            except BlockingIOError:
                continue
            except BrokenPipeError:          # the doctor closed its end: what it read is what is checked
                return True
        return True
    finally:
        os.close(fd)


def _wait(pid: int, deadline: float) -> int | None:
    """The child's wait status, or None once the deadline passes."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(0.005, left))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def run_fresh(argv: list[str], stdin: bytes | None, stdin_pipe: bool, cwd: str, timeout: float,
              env: dict[str, str] | None = None) -> Outcome:
    """The same through a fresh `python -m vllm_doctor` (to confirm what a forked run found)."""
    env = dict(os.environ, **(env or {}), NO_COLOR="1")
    env.pop("FORCE_COLOR", None)
    start = time.monotonic()
    with tempfile.TemporaryFile() as spool:
        if stdin is not None and not stdin_pipe:
            spool.write(stdin)
            spool.seek(0)
        stdin_arg = subprocess.PIPE if stdin is not None and stdin_pipe else \
            (spool if stdin is not None else subprocess.DEVNULL)
        try:
            proc = subprocess.run([sys.executable, "-m", "vllm_doctor", *argv], cwd=cwd, env=env, stdin=stdin_arg,
                                  input=stdin if stdin_arg is subprocess.PIPE else None, capture_output=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return Outcome(-9, exc.stdout or b"", exc.stderr or b"", time.monotonic() - start, hung=True)
    return Outcome(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


# ----------------------------------------------------------------------------------------- checks

def _own_paths() -> tuple[str, ...]:
    import sysconfig

    import vllm_doctor

    paths = {str(Path(vllm_doctor.__file__).resolve().parent), sysconfig.get_paths()["stdlib"],
             sysconfig.get_paths()["purelib"]}
    return tuple(sorted(paths))


# A traceback printed by this interpreter: a frame in the package, the stdlib or site-packages it runs
# from (the tracebacks quoted from a log name the server's paths, never these).
TRACEBACK_START = re.compile(r"^(?:Traceback \(most recent call last\):|Exception in thread |Exception ignored in)",
                             re.M)
SWALLOWED = re.compile(r"vllm-doctor: (?:error: (?:[A-Za-z_][\w.]*(?:Error|Exception|Exit)|KeyError|StopIteration)"
                       r"(?::|$)|diagnosis stopped: internal error)", re.M)


def find_traceback(stderr: str, own: tuple[str, ...]) -> str:
    """The first traceback of our own in stderr ("" when none): its opening line and frames."""
    for m in TRACEBACK_START.finditer(stderr):
        block = stderr[m.start(): m.start() + 4000]
        frames = re.findall(r'^  File "([^"]+)"', block, re.M)
        if m.group(0).startswith("Exception") or any(f.startswith(own) for f in frames):
            return block.split("\n\n")[0][:1500]
    return ""


def strict_json(data: bytes) -> str:
    """"" when `data` is one strict JSON document, else why not."""
    def refuse(name: str):
        raise ValueError(f"non-standard constant {name}")

    try:
        text = data.decode("utf-8")
        json.loads(text, parse_constant=refuse)
    except (UnicodeDecodeError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    lone = re.search(r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}", text, re.I)
    return f"lone surrogate escape {lone.group(0)}" if lone else ""


def check(mode: str, fmt: str, data: bytes, outcome: Outcome, own: tuple[str, ...]) -> list[tuple[str, str]]:
    """(kind, detail) for every contract the run broke."""
    problems: list[tuple[str, str]] = []
    err = outcome.stderr.decode("utf-8", "replace")
    if outcome.hung:
        problems.append(("hang", f"still running after {outcome.wall:.0f} s"))
    tb = outcome.crashed or find_traceback(err, own)
    if tb:
        problems.append(("traceback", tb.strip().splitlines()[-1][:300]))
    swallowed = SWALLOWED.search(err)
    if swallowed:
        line = err[swallowed.start():].split("\n", 1)[0]
        problems.append(("swallowed", line[:300]))
    if outcome.rc not in (0, 1, 2) and not outcome.hung:
        problems.append(("exit", f"exit code {outcome.rc}"))
    if outcome.rc == 2 and "vllm-doctor: " not in err:
        problems.append(("exit", "exit 2 without a `vllm-doctor: ` line"))
    if mode == "pipe" and outcome.stdout != data:
        problems.append(("lost-bytes", f"stdout {len(outcome.stdout)} bytes, stdin {len(data)} bytes"))
    if fmt == "json" and outcome.rc in (0, 1) and not outcome.hung:
        document = outcome.stderr if mode == "pipe" else outcome.stdout
        why = strict_json(document)
        if why:
            problems.append(("json", why))
    return problems


# ----------------------------------------------------------------------------------------- one input

@dataclass
class Result:
    name: str
    family: str
    base: str
    runs: list[dict] = field(default_factory=list)   # mode, format, options, rc, wall, problems


def run_input(fz: FuzzInput, *, timeout: float = 60.0, fresh: bool = False, workdir: str | None = None) -> Result:
    """Every run of one input, checked."""
    own = _own_paths()
    runner = run_fresh if fresh else run_forked
    result = Result(fz.name, fz.family, fz.base)
    with tempfile.TemporaryDirectory(prefix="vllm-doctor-fuzz-", dir=workdir) as tmp:
        path = os.path.join(tmp, "input" + fz.suffix)
        with open(path, "wb") as f:
            f.write(fz.data)
        for mode, fmt, extra, pipe in fz.runs:
            argv = argv_for(mode, fmt, extra, path)
            stdin = None if mode == "file" else fz.data
            outcome = runner(argv, stdin, pipe, tmp, timeout)
            result.runs.append({"mode": mode, "format": fmt, "options": extra, "stdin_pipe": pipe,
                                "rc": outcome.rc, "wall": round(outcome.wall, 3),
                                "problems": check(mode, fmt, fz.data, outcome, own)})
    return result


# ----------------------------------------------------------------------------------------- many inputs

_CORPUS: Corpus | None = None


def _worker_init() -> None:
    global _CORPUS
    warm()
    _CORPUS = load_corpus()


def _worker_run(task: tuple[int, int, float]) -> Result:
    seed, index, timeout = task
    return run_input(make_input(seed, index, _CORPUS), timeout=timeout)


def run_many(seed: int, indices: list[int], *, workers: int = 2, timeout: float = 60.0,
             progress: Callable[[int, Result], None] | None = None) -> list[Result]:
    """Inputs `indices` of run `seed` over `workers` forked worker processes; results in index order."""
    import multiprocessing

    tasks = [(seed, i, timeout) for i in indices]
    if workers <= 1:
        _worker_init()
        results = []
        for n, task in enumerate(tasks):
            results.append(_worker_run(task))
            if progress:
                progress(n, results[-1])
        return results
    ctx = multiprocessing.get_context("fork")
    results = []
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        for n, result in enumerate(pool.imap_unordered(_worker_run, tasks)):
            results.append(result)
            if progress:
                progress(n, result)
    return sorted(results, key=lambda r: int(r.name.split(":")[1]))


def failures(results: list[Result]) -> list[tuple[str, str, dict, str, str]]:
    """(input name, family, run, kind, detail) for every broken contract."""
    return [(r.name, r.family, run, kind, detail) for r in results for run in r.runs
            for kind, detail in run["problems"]]


def summarize(results: list[Result], elapsed: float) -> str:
    lines = []
    fams = Counter(r.family for r in results)
    pairs = Counter((run["mode"], run["format"]) for r in results for run in r.runs)
    walls = sorted(run["wall"] for r in results for run in r.runs)
    lines.append(f"{len(results)} inputs, {sum(pairs.values())} runs in {elapsed:.0f} s "
                 f"(run wall: median {walls[len(walls) // 2] if walls else 0:.2f} s, max {walls[-1] if walls else 0:.2f} s)")
    lines.append("inputs per family: " + ", ".join(f"{f} {n}" for f, n in sorted(fams.items())))
    lines.append("runs per mode x format: " + ", ".join(f"{m}/{f} {n}" for (m, f), n in sorted(pairs.items())))
    found = failures(results)
    kinds = ("traceback", "lost-bytes", "exit", "json", "hang", "swallowed")
    titles = {"traceback": "tracebacks", "lost-bytes": "lost-byte cases", "exit": "bad exit codes",
              "json": "non-strict JSON", "hang": "hangs", "swallowed": "exceptions swallowed into one line"}
    for kind in kinds:
        hits = [f for f in found if f[3] == kind]
        lines.append(f"{titles[kind]}: {len(hits)}")
        by_detail: dict[str, list[str]] = defaultdict(list)
        for name, family, run, _, detail in hits:
            by_detail[_signature(detail)].append(f"{name} {family} {run['mode']}/{run['format']}")
        for detail, where in sorted(by_detail.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {len(where):4d} x {detail}")
            lines.append(f"         e.g. {', '.join(where[:4])}")
    return "\n".join(lines)


def _signature(detail: str) -> str:
    """A failure's detail with its numbers dropped, to group the same failure met on many inputs."""
    return re.sub(r"\d+", "N", detail)[:200]


def save_input(fz: FuzzInput, directory: Path) -> list[str]:
    """Write the input to `directory`; the shell commands that replay its runs with the real CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"fuzz-{fz.seed}-{fz.index}{fz.suffix}"
    path.write_bytes(fz.data)
    out = []
    for mode, fmt, extra, pipe in fz.runs:
        import shlex

        argv = shlex.join(["vllm-doctor", *argv_for(mode, fmt, extra, str(path))])
        out.append(f"{argv} </dev/null" if mode == "file" else
                   f"cat {shlex.quote(str(path))} | {argv}" if pipe else f"{argv} < {shlex.quote(str(path))}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=2000, help="inputs to make and run (default 2000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--index", type=int, action="append", help="only this input (repeatable)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one run may take (a hang guard)")
    p.add_argument("--fresh", action="store_true", help="run a fresh interpreter per run (slow; to confirm)")
    p.add_argument("--save", metavar="DIR", help="write the inputs of --index to DIR with replay commands")
    p.add_argument("--json", metavar="FILE", help="also write every run's result to FILE")
    args = p.parse_args(argv)
    indices = args.index or list(range(args.count))
    corpus = load_corpus()
    if args.save:
        for i in indices:
            fz = make_input(args.seed, i, corpus)
            print(f"# {fz.name} {fz.family} from {fz.base}")
            print("\n".join(save_input(fz, Path(args.save))))
    start = time.monotonic()
    if args.fresh:
        results = [run_input(make_input(args.seed, i, corpus), timeout=args.timeout, fresh=True) for i in indices]
    else:
        def progress(n: int, result: Result) -> None:
            if (n + 1) % 100 == 0:
                print(f"... {n + 1}/{len(indices)} inputs, {time.monotonic() - start:.0f} s", file=sys.stderr)

        results = run_many(args.seed, indices, workers=args.workers, timeout=args.timeout, progress=progress)
    print(summarize(results, time.monotonic() - start))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 1 if failures(results) else 0


if __name__ == "__main__":
    sys.exit(main())
