"""Helpers for the live-mode tests (pipe, run, follow): processes, bounded waits, real log shapes."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("FORCE_COLOR", None)
DOCTOR = [sys.executable, "-m", "vllm_doctor"]

# The tensor-parallel failure of tests/data/corpus-dev/07-tp3-40heads.log, shortened (real message shapes).
TP_FAILURE = """\
$ vllm serve /models/tiny40 --tensor-parallel-size 3
(APIServer pid=30416) INFO 12-01 00:31:17 [api_utils.py:286] non-default args: {'model_tag': '/models/tiny40', 'model': '/models/tiny40', 'tensor_parallel_size': 3}
(APIServer pid=30416) INFO 12-01 00:31:25 [model.py:733] Resolved architecture: LlamaForCausalLM
(APIServer pid=30416) INFO 12-01 00:31:25 [model.py:2152] Using max model len 4096
Traceback (most recent call last):
  File "/opt/venv/bin/vllm", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 2838, in create_engine_config
    config = VllmConfig(
  File "/opt/venv/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 121, in __init__
    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Value error, Total number of attention heads (40) must be divisible by tensor parallel size (3). [type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""
FATAL_LINENO = 13

HEALTHY = """\
(APIServer pid=30416) INFO 12-01 00:31:17 [api_utils.py:286] non-default args: {'model_tag': '/models/tiny40', 'model': '/models/tiny40'}
(APIServer pid=30416) INFO 12-01 00:31:25 [model.py:2152] Using max model len 4096
(APIServer pid=30416) INFO 12-01 00:32:01 [api_server.py:1920] Starting vLLM API server 0 on http://0.0.0.0:8000
"""

# A predictive warning (nccl-timeout, kind "warning"): a worker that does not answer.
WARNING = ("(EngineCore_DP0 pid=4242) INFO 12-01 00:40:00 [shm_broadcast.py:466] No available shared memory "
           "broadcast block found in 60 seconds. This typically happens when some processes are hanging or "
           "doing some time-consuming work (e.g. compilation, weight/kv cache quantization).\n")


class Collector:
    """Reads a binary stream in a thread; `wait_for` polls with a deadline (never hangs a test)."""

    def __init__(self, stream) -> None:
        self.data = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self.data += chunk

    def text(self) -> str:
        with self._lock:
            return self.data.decode("utf-8", "replace")

    def wait_for(self, needle: str, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if needle in self.text():
                return True
            time.sleep(0.02)
        return needle in self.text()

    def wait_for_bytes(self, count: int, timeout: float = 10.0) -> bool:
        """True once at least `count` bytes arrived (polled with a deadline, like wait_for)."""
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.data) >= count:
                    return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)


def spawn(args: list[str], **kw) -> subprocess.Popen:
    kw.setdefault("stdin", subprocess.PIPE)
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("env", ENV)
    return subprocess.Popen(DOCTOR + args, cwd=ROOT, **kw)


def no_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" not in text.replace(TP_FAILURE, "")
