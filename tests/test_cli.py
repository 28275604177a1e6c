"""The CLI as a user meets it: exit codes, bad input, no tracebacks, light start-up."""
import json
import os

import pytest

from conftest import CORPUS_DEV, ROOT, run_cli

EXAMPLE = ROOT / "logs_corpus/parallel/vicuna13b-tp3.log"


def test_missing_file_is_one_line_exit_2(tmp_path):
    proc = run_cli(str(tmp_path / "nope.log"))
    assert proc.returncode == 2
    err = proc.stderr.decode().strip()
    assert err.startswith("vllm-doctor: error: cannot read") and "\n" not in err


def test_directory_is_input_error(tmp_path):
    proc = run_cli(str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr.decode()


def test_empty_and_binary_files_are_refused_not_all_clear(tmp_path):
    """'No problem found' in an empty file or in random bytes would be a false all-clear: one line, exit 2."""
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    binary = tmp_path / "bin.log"
    binary.write_bytes(os.urandom(300_000) + b"\x00\xff" * 1000)
    for path, why in ((empty, "is empty"), (binary, "binary data")):
        proc = run_cli("--no-live", "--format", "json", str(path))
        lines = proc.stderr.decode().strip().splitlines()
        assert proc.returncode == 2 and proc.stdout == b"" and len(lines) == 1 and why in lines[0], proc.stderr


def _real_log() -> bytes:
    """A real tensor-parallel failure (the README's example) behind 900 lines of metrics chatter, so
    that a cut of the compressed file can land after the start but before the failure."""
    noise = b"".join(b"INFO 12-01 00:35:%02d [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
                     b"Avg generation throughput: %d.0 tokens/s\n" % (i % 60, i) for i in range(900))
    return noise + (ROOT / "logs_corpus/parallel/vicuna13b-tp3.log").read_bytes()


@pytest.mark.parametrize("suffix, pack", [
    (".gz", lambda b: __import__("gzip").compress(b)),
    (".bz2", lambda b: __import__("bz2").compress(b)),
    (".xz", lambda b: __import__("lzma").compress(b)),
    (".gz", lambda b: __import__("gzip").compress(b[:4000]) + __import__("gzip").compress(b[4000:])),  # cat a.gz b.gz
    ("", lambda b: b"\xff\xfe" + b.decode().encode("utf-16-le")),       # PowerShell's `>`
    ("", lambda b: b.decode().encode("utf-16-le")),                       # UTF-16 without a BOM
])
def test_compressed_and_utf16_logs_are_read(tmp_path, suffix, pack):
    path = tmp_path / f"server.log{suffix}"
    path.write_bytes(pack(_real_log()))
    proc = run_cli("--no-live", "--format", "json", str(path))
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["findings"][0]["rule"] == "tp-heads-indivisible", proc.stderr
    assert "--tensor-parallel-size 2" in report["findings"][0]["fix"]["command"]
    assert any(str(path) in n and ("compressed" in n or "UTF-16" in n) for n in report["notices"])


def test_a_cut_compressed_log_is_read_up_to_the_cut(tmp_path):
    import gzip

    data = gzip.compress(_real_log())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[:len(data) // 2])         # copied while the server was still writing
    proc = run_cli("--no-live", "--format", "json", str(cut))
    assert proc.returncode in (0, 1), proc.stderr  # read, not refused: what was written so far counts
    report = json.loads(proc.stdout)
    assert any(str(cut) in n and "cut short" in n for n in report["notices"]), report["notices"]


def test_archives_that_are_no_log_are_refused(tmp_path):
    import zipfile

    zipped = tmp_path / "logs.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("server.log", _real_log())
    proc = run_cli("--no-live", str(zipped))
    assert proc.returncode == 2 and "zip archive" in proc.stderr.decode(), proc.stderr


def test_truncated_traceback_is_unrecognized_not_a_crash(tmp_path):
    log = tmp_path / "cut.log"
    log.write_text("INFO 05-12 10:11:12 llm_engine.py:98] Initializing\nTraceback (most recent call last):\n"
                   '  File "/x/vllm/worker.py", line 3, in load\n    model = get_model()\n')
    proc = run_cli("--no-live", "--format", "json", str(log))
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["status"] == "unrecognized"
    assert report["findings"][0]["rule"] == "unrecognized"


def test_unknown_exception_reports_it_as_unrecognized(tmp_path):
    log = tmp_path / "odd.log"
    log.write_text("Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
                   "ZeroDivisionError: division by zero\n"
                   "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    top = report["findings"][0]
    assert top["rule"] == "unrecognized" and "ZeroDivisionError" in top["evidence"][0]["text"]


def test_json_schema_shape():
    proc = run_cli("--no-live", "--format", "json", str(CORPUS_DEV / "07-tp3-40heads.log"))
    report = json.loads(proc.stdout)
    assert set(report) == {"schema_version", "status", "findings", "warnings", "notices", "facts", "combined_fix",
                           "run", "earlier_runs", "outcome", "first_failure"}
    assert report["outcome"] == "did not serve"
    first = report["first_failure"]        # one machine: no node; the root cause's line
    assert first["node"] is None and first["line"] == report["findings"][0]["evidence"][0]["line"]
    assert report["combined_fix"]["form"] == "command" and report["combined_fix"]["rules"] == ["tp-heads-indivisible"]
    assert report["run"] == "" and report["earlier_runs"] == []
    assert report["schema_version"] == 2 and report["status"] == "problem"
    f = report["findings"][0]
    assert set(f) == {"rule", "title", "severity", "confidence", "evidence", "more_like_it", "explanation", "notes",
                      "errors", "facts", "fix"}
    assert f["more_like_it"] == 0
    assert set(f["fix"]) == {"summary", "command", "unchanged", "env", "alternatives", "form", "changes", "instruction"}
    assert f["fix"]["changes"] == ["--tensor-parallel-size 3 -> 2"]
    assert set(f["evidence"][0]) == {"source", "line", "text"}


def test_text_report_is_plain_without_a_terminal():
    proc = run_cli("--no-live", str(CORPUS_DEV / "07-tp3-40heads.log"))
    out = proc.stdout.decode()
    assert proc.returncode == 1 and "\x1b[" not in out
    assert "tp-heads-indivisible" in out and "--tensor-parallel-size" in out


def test_malformed_rules_dir_exit_2(tmp_path):
    (tmp_path / "bad.toml").write_text("id = [")
    proc = run_cli("--rules-dir", str(tmp_path), str(CORPUS_DEV / "07-tp3-40heads.log"))
    assert proc.returncode == 2 and proc.stderr.decode().count("\n") == 1


def test_plain_diagnosis_does_not_import_heavy_modules(tmp_path):
    code = ("import sys; from vllm_doctor.cli.main import main; rc = main(['--no-live', '--format', 'json', sys.argv[1]]);"
            "heavy = [m for m in ('transformers', 'textual', 'torch', 'vllm') if m in sys.modules];"
            "sys.stderr.write('HEAVY=' + ','.join(heavy))")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", code, str(CORPUS_DEV / "07-tp3-40heads.log")],
                          capture_output=True, cwd=ROOT, timeout=120)
    assert proc.stderr.decode().rsplit("HEAVY=", 1)[1] == ""


def test_facts_snapshot_round_trip_gives_the_same_diagnosis(tmp_path):
    snap = tmp_path / "snap.json"
    snap.write_text(run_cli("facts", "--format", "json").stdout.decode())
    log = str(CORPUS_DEV / "07-tp3-40heads.log")
    a = json.loads(run_cli("--no-live", "--format", "json", "--facts", str(snap), log).stdout)
    b = json.loads(run_cli("--no-live", "--format", "json", "--facts", str(snap), log).stdout)
    assert a["findings"][0]["fix"] == b["findings"][0]["fix"]
    assert any(v["source"] == "snapshot" for v in a["facts"].values())


def test_bad_snapshot_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    proc = run_cli("--facts", str(bad), str(CORPUS_DEV / "07-tp3-40heads.log"))
    assert proc.returncode == 2 and proc.stderr.decode().count("\n") == 1


def test_collect_env_block_pasted_in_a_log_becomes_facts(tmp_path):
    log = tmp_path / "pasted.log"
    log.write_text(
        "Collecting environment information...\nPyTorch version: 2.4.0+cu121\nIs debug build: False\n"
        "CUDA used to build PyTorch: 12.1\nGPU models and configuration: \nGPU 0: NVIDIA A100-SXM4-40GB\n"
        "GPU 1: NVIDIA A100-SXM4-40GB\nGPU 2: NVIDIA A100-SXM4-40GB\n\nNvidia driver version: 535.104.05\n"
        "vLLM Version: 0.5.4\n"
        "INFO 08-01 10:00:00 api_server.py:339] vLLM API server version 0.5.4\n"
        "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert report["facts"]["gpu.count"] == {"value": 3, "source": "log"}
    assert report["findings"][0]["rule"] == "tp-heads-indivisible"


def test_generic_symptom_of_the_same_family_folds_into_the_root(tmp_path):
    log = tmp_path / "shm.log"
    log.write_text(
        "node1:221:310 [1] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-Xk29qa to 7340036 bytes\n"
        "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert [f["rule"] for f in report["findings"]] == ["nccl-shm"]
    text = run_cli("--no-live", "-v", str(log)).stdout.decode()      # related lines: -v
    assert "unhandled system error" in text and "related: line 2: RuntimeError: NCCL error" in text
    assert "unhandled system error" not in run_cli("--no-live", str(log)).stdout.decode()


def test_generic_symptom_of_another_family_folds_into_the_specific_cause(tmp_path):
    """nccl-generic only stands alone: after NCCL's own `Cuda failure 'out of memory'` it corroborates the OOM."""
    log = tmp_path / "nccl-oom.log"
    log.write_text(
        "gpu-h-1:412:412 [1] include/alloc.h:320 NCCL WARN Cuda failure 2 'out of memory'\n"
        "(VllmWorker rank=1 pid=412) ERROR 05-20 10:00:40 [multiproc_executor.py:527] RuntimeError: NCCL error: "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert [f["rule"] for f in report["findings"]] == ["cuda-oom-runtime"]
    alone = tmp_path / "nccl-only.log"
    alone.write_text(log.read_text().split("\n", 1)[1])
    report = json.loads(run_cli("--no-live", "--format", "json", str(alone)).stdout)
    assert [f["rule"] for f in report["findings"]] == ["nccl-generic"]


def test_errors_the_server_recovered_from_are_not_findings(tmp_path):
    log = tmp_path / "recovered.log"
    log.write_text(
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in probe\nImportError: no flash_attn\n"
        "ERROR 05-12 10:11:12 [x.py:1] OSError: [Errno 98] Address already in use\n"
        "INFO 05-12 10:11:13 [launcher.py:1] Starting vLLM API server 0 on http://0.0.0.0:8001\n"
        "INFO:     Application startup complete.\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert report["status"] == "ok" and report["findings"] == []
    log.write_text(log.read_text() + "Traceback (most recent call last):\n  File \"y.py\", line 2, in serve\n"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                   "capacity of 79.10 GiB of which 1.00 GiB is free.\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert report["findings"][0]["rule"] == "cuda-oom-runtime"


def test_launch_command_with_env_prefix_at_the_top_of_the_log(tmp_path):
    log = tmp_path / "omp.log"
    log.write_text("$ OMP_NUM_THREADS=8 vllm serve /models/tiny40 --tensor-parallel-size 3\n"
                   "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert report["findings"][0]["fix"]["command"].startswith("OMP_NUM_THREADS=8 vllm serve /models/tiny40 ")


def test_options_before_a_subcommand_apply_to_it():
    from vllm_doctor.cli.main import hoist_subcommand

    assert hoist_subcommand(["--no-live", "check", "vllm", "serve", "m"]) == ["check", "--no-live", "vllm", "serve", "m"]
    assert hoist_subcommand(["--format", "json", "rules"]) == ["rules", "--format", "json"]
    # an option's value is not a sub-command, and a log file stays a log file
    assert hoist_subcommand(["--cmd", "run", "x.log"]) == ["--cmd", "run", "x.log"]
    assert hoist_subcommand(["--no-live", "x.log"]) == ["--no-live", "x.log"]
    proc = run_cli("--format", "json", "rules")
    assert proc.returncode == 0 and json.loads(proc.stdout)[0]["id"]
    proc = run_cli("--no-live", "--format", "json", "check", "vllm", "serve", "/nowhere/model", "-tp", "3")
    # no config for /nowhere/model and no GPUs here: "could not check" (3), as JSON since --format was hoisted
    assert proc.returncode == 3 and json.loads(proc.stdout)["status"] == "unchecked"


def test_closed_output_pipe_is_not_a_traceback():
    import subprocess
    import sys

    reader = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "explain", "tp-heads-indivisible"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                              env=dict(os.environ, NO_COLOR="1"))
    reader.stdout.close()      # like `| head -0`: the page is written to a pipe nobody reads
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=60) in (0, 120) and "Traceback" not in err


def test_quiet_healthy_log_is_named_and_no_placeholder_model_is_looked_up(tmp_path):
    log = tmp_path / "quiet.log"
    log.write_text("INFO 12-01 00:00:00 [x.py:1] hello\n")
    proc = run_cli(str(log))
    out = " ".join((proc.stdout.decode() + proc.stderr.decode()).split())     # a long path wraps the line
    assert proc.returncode == 0
    assert f"no problem found in {log} (1 line)." in out
    assert "'MODEL'" not in out


def test_a_shell_launcher_gets_env_prefixes_but_no_appended_flags():
    """`bash start.sh --tensor-parallel-size 2` would not reach vLLM: no command is made up for it."""
    def fix(cmd, log):
        proc = run_cli("--no-live", "--format", "json", "--cmd", cmd, str(ROOT / log))
        return json.loads(proc.stdout)["findings"][0]

    tp = fix("bash start.sh", "logs_corpus/parallel/vicuna13b-tp3.log")
    assert tp["rule"] == "tp-heads-indivisible" and tp["fix"]["command"] is None
    assert "--tensor-parallel-size 2" in tp["fix"]["summary"]
    assert fix("vllm serve lmsys/vicuna-13b-v1.5 -tp 3", "logs_corpus/parallel/vicuna13b-tp3.log")["fix"]["command"] \
        == "vllm serve lmsys/vicuna-13b-v1.5 -tp 2"
    port = fix("HF_HOME=/srv/hf ./serve.sh", "logs_corpus/config/c25-port-in-use-v032.log")
    assert port["rule"] == "port-in-use" and port["fix"]["command"] is None
    fork = fix("bash run.sh", "logs_corpus/config/c27-cuda-fork-script.log")
    assert fork["rule"] == "cuda-fork" and fork["fix"]["command"] == "VLLM_WORKER_MULTIPROC_METHOD=spawn bash run.sh"


def test_a_mistyped_sub_command_gets_a_did_you_mean():
    proc = run_cli("explian", "tp-heads-indivisible")
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "did you mean 'vllm-doctor explain'?" in lines[0]
    other = run_cli("no-such-log")           # nothing like a sub-command: the plain missing-file error
    assert other.returncode == 2 and "did you mean" not in other.stderr.decode()
    assert "cannot read no-such-log" in other.stderr.decode()
