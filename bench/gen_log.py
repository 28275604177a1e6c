"""Realistic vLLM log generator for the benchmarks (written to a temp dir, never committed).

Shapes come from real vLLM output (tests/data/corpus-dev and docs/reference/vllm-messages.md): multi-process prefixes
(`(APIServer pid=N)`, `(Worker_TP1 pid=N)`, `(EngineCore_DP0 pid=N)`), NCCL INFO floods, request-log
and access-log lines, periodic metrics lines, ANSI colour on some lines, and a failure signature (a
real traceback or NCCL WARN) once per `--every` lines (default 10^5).

Scenario logs for the load benchmarks (--scenario):
  crash-loop    a real failing start-up log (default logs_corpus/real032/r04-...) repeated to --size,
                pids and timestamps moved on at each repetition, as a restart loop writes it;
  nccl-flood    --lines NCCL WARN lines (shared-memory extend failure, varying pid/rank, a segment per worker) with
                a healthy line every 1000;
  nccl-repeat   a normal start-up (logs_corpus/real032/r33-...) then --lines NCCL WARN lines.

    python bench/gen_log.py --size 100M [--out FILE] [--seed 1]
    python bench/gen_log.py --scenario crash-loop --size 200M | --scenario nccl-flood --lines 1M
"""
from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

FAILURES = [
    # tensor-parallel heads (pydantic-wrapped ValueError, 0.9.1+)
    """Traceback (most recent call last):
  File "/opt/venv/bin/vllm", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 2838, in create_engine_config
    config = VllmConfig(
  File "/opt/venv/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 121, in __init__
    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Value error, Total number of attention heads (40) must be divisible by tensor parallel size (3). [type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error""",
    # CUDA OOM in a worker
    """(Worker_TP{r} pid={pid}) ERROR 12-01 00:37:45 [multiproc_executor.py:671] WorkerProc hit an exception.
(Worker_TP{r} pid={pid}) ERROR 12-01 00:37:45 [multiproc_executor.py:671] Traceback (most recent call last):
(Worker_TP{r} pid={pid}) ERROR 12-01 00:37:45 [multiproc_executor.py:671]   File "/opt/venv/lib/python3.11/site-packages/vllm/v1/worker/gpu_worker.py", line 263, in determine_available_memory
(Worker_TP{r} pid={pid}) ERROR 12-01 00:37:45 [multiproc_executor.py:671]     self.model_runner.profile_run()
(Worker_TP{r} pid={pid}) ERROR 12-01 00:37:45 [multiproc_executor.py:671] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.01 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.""",
    # NCCL shared memory
    """(Worker_TP{r} pid={pid}) node1:{pid}:{pid2} [{r}] include/alloc.h:212 NCCL WARN Error: failed to extend /dev/shm/nccl-ZyN8n0 to 9637892 bytes, error: No space left on device (28)
(Worker_TP{r} pid={pid}) node1:{pid}:{pid2} [{r}] NCCL INFO transport/shm.cc:114 -> 2
(Worker_TP{r} pid={pid}) [rank{r}]: RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5""",
]

WORDS = ("the quick brown fox jumps over a lazy dog while models serve tokens to many users "
         "explain write summarize translate code review poem story list answer question").split()


def _ansi(rng: random.Random, text: str) -> str:
    return f"\x1b[32m{text[:4]}\x1b[0m{text[4:]}" if rng.random() < 0.3 else text


def line_pool(rng: random.Random, n: int = 20000) -> list[str]:
    pids = [rng.randint(1000, 99999) for _ in range(8)]
    api = f"(APIServer pid={pids[0]})"
    core = f"(EngineCore_DP0 pid={pids[1]})"
    out: list[str] = []
    for _ in range(n):
        t = f"12-01 {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        r = rng.randint(0, 3)
        worker = f"(Worker_TP{r} pid={pids[2 + r]})"
        k = rng.random()
        if k < 0.40:      # NCCL INFO flood
            ch = rng.randint(0, 31)
            out.append(rng.choice([
                f"{worker} node1:{pids[2 + r]}:{pids[2 + r] + 17} [{r}] NCCL INFO Channel {ch:02d}/0 : {r}[{r}] -> {(r + 1) % 4}[{(r + 1) % 4}] via P2P/CUMEM/read",
                f"{worker} node1:{pids[2 + r]}:{pids[2 + r] + 17} [{r}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
                f"{worker} node1:{pids[2 + r]}:{pids[2 + r] + 17} [{r}] NCCL INFO ncclCommInitRank comm 0x{rng.getrandbits(40):x} rank {r} nranks 4 cudaDev {r} nvmlDev {r} busId {r}0000 commId 0x{rng.getrandbits(60):x} - Init COMPLETE",
                f"{worker} node1:{pids[2 + r]}:{pids[2 + r] + 17} [{r}] NCCL INFO P2P Chunksize set to 524288",
            ]))
        elif k < 0.65:    # request log
            prompt = " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))
            out.append(_ansi(rng, f"{api} INFO {t} [logger.py:43] Received request chatcmpl-{rng.getrandbits(64):016x}: "
                                  f"prompt: '{prompt}', params: SamplingParams(n=1, temperature={rng.random():.2f}, "
                                  f"top_p=1.0, max_tokens={rng.randint(16, 4096)}), prompt_token_ids: None, lora_request: None."))
        elif k < 0.85:    # access log
            out.append(f"{api} INFO:     10.0.{rng.randint(0, 255)}.{rng.randint(0, 255)}:{rng.randint(1024, 65535)} - "
                       f"\"POST /v1/chat/completions HTTP/1.1\" 200 OK")
        elif k < 0.97:    # metrics
            out.append(_ansi(rng, f"{api} INFO {t} [loggers.py:123] Engine 000: Avg prompt throughput: {rng.random() * 5000:.1f} tokens/s, "
                                  f"Avg generation throughput: {rng.random() * 3000:.1f} tokens/s, Running: {rng.randint(0, 256)} reqs, "
                                  f"Waiting: {rng.randint(0, 50)} reqs, GPU KV cache usage: {rng.random() * 100:.1f}%, "
                                  f"Prefix cache hit rate: {rng.random() * 100:.1f}%"))
        else:             # engine chatter, debug
            out.append(rng.choice([
                f"{core} DEBUG {t} [core.py:412] Added request cmpl-{rng.getrandbits(48):x} to the scheduler",
                f"{core} DEBUG {t} [scheduler.py:1180] Finished request cmpl-{rng.getrandbits(48):x}",
                f"{api} WARNING {t} [protocol.py:93] The following fields were present in the request but ignored: {{'stream_options'}}",
            ]))
    return out


def failure(rng: random.Random, index: int) -> str:
    r = rng.randint(0, 3)
    pid = rng.randint(1000, 99999)
    text = FAILURES[index % len(FAILURES)]
    return text.replace("{r}", str(r)).replace("{pid2}", str(pid + 17)).replace("{pid}", str(pid))


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def generate(path: str, size: int, seed: int = 1, every: int = 100_000) -> dict:
    """Write about `size` bytes of log to `path`; returns {'bytes', 'lines', 'failures'}."""
    rng = random.Random(seed)
    pool = line_pool(rng)
    written = lines = failures = 0
    with open(path, "wb") as f:
        while written < size:
            chunk = rng.choices(pool, k=every)
            chunk.insert(rng.randrange(every), failure(rng, failures))
            data = ("\n".join(chunk) + "\n").encode()
            if written + len(data) > size:
                # the last piece: whole lines only, no failure cut in half
                cut = data.rfind(b"\n", 0, size - written) + 1
                data = data[:cut] if cut else b""
                if not data:
                    break
            else:
                failures += 1
            f.write(data)
            written += len(data)
            lines += data.count(b"\n")
    return {"bytes": written, "lines": lines, "failures": failures}


def bench_dir(directory: str | None = None) -> str:
    directory = directory or os.path.join(tempfile.gettempdir(), "vllm-doctor-bench")
    os.makedirs(directory, exist_ok=True)
    return directory


def _cached(name: str, make: Callable[[str], object], min_size: int = 1, directory: str | None = None) -> str:
    """`name` in the bench temp dir, written by `make(path)` unless a big enough copy is there."""
    path = os.path.join(bench_dir(directory), name)
    if not (os.path.exists(path) and os.path.getsize(path) >= min_size):
        make(path + ".part")
        os.replace(path + ".part", path)
    return path


def cached(size: int, directory: str | None = None, seed: int = 1) -> str:
    """A generated log of `size` bytes in the temp dir, reused between benchmark runs."""
    return _cached(f"vllm-{size}-s{seed}.log", lambda p: generate(p, size, seed), int(size * 0.99), directory)


def count_lines(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += chunk.count(b"\n")
    return n


# ---- scenario logs -------------------------------------------------------------------------------

CORPUS = Path(__file__).resolve().parent.parent / "logs_corpus"
CRASH_TEMPLATE = CORPUS / "real032" / "r04-tp5-40heads-8kv-assert.log"     # tp5 start-up, engine dies
STARTUP_PREFIX = CORPUS / "real032" / "r33-healthy-tiny512-port8080.log"   # a normal start-up
_TOKEN = re.compile(r"pid=(\d+)|\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")


def _template(text: str) -> tuple[list[str], list[int | datetime.datetime]]:
    """`text` cut at each pid and timestamp: literal pieces and the values between them."""
    pieces, values, at = [], [], 0
    for m in _TOKEN.finditer(text):
        pieces.append(text[at:m.start()] + ("pid=" if m.group(1) else ""))
        if m.group(1):
            values.append(int(m.group(1)))
        else:
            mo, d, h, mi, sec = (int(g) for g in m.groups()[1:])
            values.append(datetime.datetime(2025, mo, d, h, mi, sec))
        at = m.end()
    pieces.append(text[at:])
    return pieces, values


def _repetition(pieces: list[str], values: list, rep: int) -> str:
    shift = datetime.timedelta(seconds=75 * rep)      # a restart every 75 s
    out = [pieces[0]]
    for piece, value in zip(pieces[1:], values):
        out.append(str((value + 37 * rep - 1000) % 98000 + 1000) if isinstance(value, int)
                   else (value + shift).strftime("%m-%d %H:%M:%S"))
        out.append(piece)
    return "".join(out)


def crash_loop(path: str, size: int, template: Path = CRASH_TEMPLATE) -> dict:
    """A failing start-up log written again and again up to `size` bytes, new pids and times each time."""
    text = template.read_text(encoding="utf-8")
    text += "" if text.endswith("\n") else "\n"
    pieces, values = _template(text)
    written = reps = 0
    with open(path, "wb") as f:
        while written < size:
            data = _repetition(pieces, values, reps).encode()
            f.write(data)
            written += len(data)
            reps += 1
    return {"bytes": written, "repetitions": reps}


def nccl_warn(rng: random.Random, pids: list[int]) -> str:
    r = rng.randrange(len(pids))
    # each worker retries its own segment (NCCL names one per process: nccl-XXXXXX), with a new size
    seg = "".join(random.Random(pids[r]).choices("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", k=6))
    return (f"(Worker_TP{r} pid={pids[r]}) node1:{pids[r]}:{pids[r] + 71} [{r}] include/alloc.h:212 NCCL WARN "
            f"Error: failed to extend /dev/shm/nccl-{seg} to {rng.randint(1 << 20, 1 << 26)} bytes, "
            f"error: No space left on device (28)")


def nccl_flood(path: str, lines: int, seed: int = 1, prefix: Path | None = None, healthy_every: int = 1000) -> dict:
    """`lines` NCCL WARN lines (after `prefix`'s text, if any), a healthy line after every `healthy_every`."""
    rng = random.Random(seed)
    pool = line_pool(rng, 2000)
    written = healthy = 0
    with open(path, "wb") as f:
        if prefix is not None:
            f.write(prefix.read_bytes())
        while written < lines:
            pids = [rng.randint(1000, 99999) for _ in range(8)]        # a new set of workers now and then
            n = min(healthy_every or 1000, lines - written)
            chunk = [nccl_warn(rng, pids) for _ in range(n)]
            if n == healthy_every:
                chunk.append(rng.choice(pool))
                healthy += 1
            f.write(("\n".join(chunk) + "\n").encode())
            written += n
    return {"warn_lines": written, "healthy_lines": healthy}


def _startup_prefix(path: str) -> Path:
    """The start-up of STARTUP_PREFIX up to `Application startup complete.`, as a file."""
    lines = STARTUP_PREFIX.read_text(encoding="utf-8").splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines) if "Application startup complete" in line), len(lines) - 1)
    out = Path(path)
    out.write_text("".join(lines[:end + 1]), encoding="utf-8")
    return out


def cached_scenario(kind: str, amount: int, seed: int = 1, directory: str | None = None) -> str:
    """A scenario log in the temp dir: crash-loop (`amount` bytes), nccl-flood / nccl-repeat (`amount`
    NCCL WARN lines)."""
    name = f"{kind}-{amount}-s{seed}.log"
    if kind == "crash-loop":
        return _cached(name, lambda p: crash_loop(p, amount), amount, directory)
    if kind == "nccl-flood":
        return _cached(name, lambda p: nccl_flood(p, amount, seed), amount * 100, directory)
    if kind == "nccl-repeat":
        prefix = _startup_prefix(os.path.join(bench_dir(directory), "startup-prefix.log"))
        return _cached(name, lambda p: nccl_flood(p, amount, seed, prefix, healthy_every=0), amount * 100, directory)
    raise ValueError(f"unknown scenario {kind!r} (crash-loop, nccl-flood, nccl-repeat)")


def parse_count(text: str) -> int:
    """100k, 1M, 300000 -> a number of lines."""
    units = {"K": 1_000, "M": 1_000_000}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="10M", help="10M, 100M, 1G ...")
    p.add_argument("--scenario", choices=["crash-loop", "nccl-flood", "nccl-repeat"],
                   help="a scenario log (in the temp dir, cached) instead of the mixed log")
    p.add_argument("--lines", default="1M", help="NCCL WARN lines of nccl-flood / nccl-repeat (100k, 1M ...)")
    p.add_argument("--out", help="file to write (default: a temp dir)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--every", type=int, default=100_000, help="one failure signature per this many lines")
    args = p.parse_args(argv)
    size = parse_size(args.size)
    if args.scenario:
        amount = size if args.scenario == "crash-loop" else parse_count(args.lines)
        path = cached_scenario(args.scenario, amount, args.seed)
        print(f"{path}: {os.path.getsize(path):,} bytes, {count_lines(path):,} lines")
        return 0
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="vllm-doctor-bench-"), f"vllm-{args.size}.log")
    info = generate(out, size, args.seed, args.every)
    print(f"{out}: {info['bytes']:,} bytes, {info['lines']:,} lines, {info['failures']} failure signatures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
