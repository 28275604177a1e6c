"""How the CLI meets a user's slips: `-` is a saved log, a command is not a log, typos get a did-you-mean,
--report says where it went, and every sub-command's --help has its own description and examples."""
import gzip
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from vllm_doctor.cli.main import _diagnose_parser, _sub_parser, is_launch_command

EXAMPLE = ROOT / "logs_corpus/parallel/vicuna13b-tp3.log"
CHATTER = b"INFO 12-01 00:35:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s\n"
SUBS = ("run", "tui", "check", "plan", "facts", "rules", "explain", "diagnose")


def one_line_error(proc) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ `-` is a saved log, the pipe is a pipe

def test_dash_reads_a_saved_log_and_echoes_nothing():
    log = CHATTER * 50 + EXAMPLE.read_bytes()
    proc = run_cli("--no-live", "-", input=log)
    out = proc.stdout.decode()
    assert proc.returncode == 1, proc.stderr
    assert "tp-heads-indivisible" in out and "<stdin>" in out      # the report, on stdout as for a file
    assert b"Avg prompt throughput" not in proc.stdout              # none of the input replayed
    assert "tp-heads-indivisible" not in proc.stderr.decode()


def test_dash_with_a_redirected_file_and_a_compressed_pipe(tmp_path):
    with open(EXAMPLE, "rb") as stdin:              # `vllm-doctor - < big.log`: a seekable descriptor
        redirected = subprocess.run([sys.executable, "-m", "vllm_doctor", "--no-live", "--format", "json", "-"],
                                    stdin=stdin, capture_output=True, cwd=ROOT, env=dict(os.environ, NO_COLOR="1"), timeout=120)
    assert redirected.returncode == 1 and b'"tp-heads-indivisible"' in redirected.stdout
    assert EXAMPLE.read_bytes()[:200] not in redirected.stdout
    zipped = run_cli("--no-live", "--format", "json", "-", input=gzip.compress(EXAMPLE.read_bytes()))
    assert zipped.returncode == 1 and b'"tp-heads-indivisible"' in zipped.stdout
    assert b"gzip-compressed" in zipped.stdout
    refused = run_cli("--no-live", "-", input=b"PK\x03\x04" + os.urandom(2000))
    assert "standard input is a zip archive" in one_line_error(refused)


def test_pipe_mode_still_passes_every_byte_through():
    data = CHATTER * 20 + b"\xff\xfe not utf-8\r\n" + EXAMPLE.read_bytes() + b"no final newline"
    proc = run_cli("--no-live", input=data)
    assert proc.stdout == data
    assert proc.returncode == 1 and "tp-heads-indivisible" in proc.stderr.decode()


@pytest.mark.parametrize("mode", ["file", "dash", "pipe", "run"])
def test_report_file_is_announced_on_stderr(tmp_path, mode):
    report = tmp_path / "report.txt"
    args, data = {"file": ([str(EXAMPLE)], None), "dash": (["-"], EXAMPLE.read_bytes()),
                  "pipe": ([], EXAMPLE.read_bytes())}.get(mode, (None, None))
    if mode == "run":
        proc = run_cli("run", "--no-live", "--report", str(report), "--", "cat", str(EXAMPLE))
    else:
        proc = run_cli("--no-live", "--report", str(report), *args, input=data)
    assert proc.returncode == 1 if mode != "run" else proc.returncode == 0, proc.stderr
    assert "tp-heads-indivisible" in report.read_text()
    err = proc.stderr.decode()
    assert f"vllm-doctor: report written to {report}\n" in err
    assert "tp-heads-indivisible" not in err.replace(f"report written to {report}", "")


def test_no_announcement_without_report():
    proc = run_cli("--no-live", str(EXAMPLE))
    assert proc.returncode == 1 and "report written" not in proc.stderr.decode()


# ------------------------------------------------------------------ did you mean

def test_a_mistyped_sub_command_with_more_words_is_not_a_missing_file():
    line = one_line_error(run_cli("chek", "vllm", "serve", "m", "-tp", "3"))
    assert line == ("vllm-doctor: error: no file 'chek' and no sub-command of that name; "
                    "did you mean 'vllm-doctor check'?")
    assert "did you mean 'vllm-doctor plan'?" in one_line_error(run_cli("plna", "./model", "--gpus", "2"))


def test_an_existing_file_named_like_a_sub_command_is_read(tmp_path):
    (tmp_path / "chek").write_bytes(EXAMPLE.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "vllm_doctor", "--no-live", "chek"], capture_output=True,
                          cwd=tmp_path, env=dict(os.environ, NO_COLOR="1"), timeout=120)
    assert proc.returncode == 1 and "tp-heads-indivisible" in proc.stdout.decode(), proc.stderr


@pytest.mark.parametrize("argv, wrong, right", [
    (["--formt", "json", str(EXAMPLE)], "--formt", "--format"),
    ([str(EXAMPLE), "--no-lve"], "--no-lve", "--no-live"),
    (["diagnose", "--anonymise", str(EXAMPLE)], "--anonymise", "--anonymize"),
    (["run", "--kil-after", "3", "--", "true"], "--kil-after", "--kill-after"),
    (["check", "--vllm-verison", "0.8.5", "--", "vllm", "serve", "m"], "--vllm-verison", "--vllm-version"),
    (["plan", "./model", "--gpsu", "2"], "--gpsu", "--gpus"),
    (["rules", "--fromat", "json"], "--fromat", "--format"),
    (["facts", "--modle", "./m"], "--modle", "--model"),
])
def test_an_unknown_option_gets_argparse_error_and_a_did_you_mean(argv, wrong, right):
    proc = run_cli(*argv)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and err.startswith("usage: "), err
    assert f"error: unrecognized arguments: {wrong}; did you mean {right}?" in err.splitlines()[-1]


def test_abbreviations_and_the_servers_own_flags_are_left_alone():
    proc = run_cli("--no-live", "--form", "json", str(EXAMPLE))      # a prefix argparse accepts
    assert proc.returncode == 1 and proc.stdout.decode().lstrip().startswith("{")
    # after the launch command starts, a flag belongs to vLLM: `check` judges it, no hint from us
    proc = run_cli("check", "--no-live", "--", "vllm", "serve", "m", "--formt", "json")
    assert proc.returncode in (0, 1) and "did you mean --format" not in proc.stderr.decode()


# ------------------------------------------------------------------ a command where a log was expected

@pytest.mark.parametrize("words", [
    ["vllm", "serve", "lmsys/vicuna-13b-v1.5", "-tp", "3"],
    ["vllm", "serve", "my model", "--max-model-len", "8192"],
    ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "-tp", "2"],
    ["CUDA_VISIBLE_DEVICES=0,1", "vllm", "serve", "m"],
    ["docker", "run", "--gpus", "all", "vllm/vllm-openai:latest", "--model", "m"],
])
def test_a_launch_command_is_answered_with_run_and_check(words):
    line = one_line_error(run_cli("--no-live", *words))
    shown = shlex.join(words)
    assert line == (f"vllm-doctor: error: '{shown}' is a command, not a log; did you mean "
                    f"`vllm-doctor run -- {shown}` (run it and diagnose) or "
                    f"`vllm-doctor check -- {shown}` (predict without running)?")


def test_a_launch_command_in_one_quoted_word():
    line = one_line_error(run_cli("vllm serve m -tp 3"))
    assert "`vllm-doctor run -- vllm serve m -tp 3`" in line and "unrecognized" not in line


@pytest.mark.parametrize("words, is_command", [
    (["vllm", "serve", "m"], True), (["/opt/venv/bin/vllm", "serve", "m"], True),
    (["python", "-m", "vllm.entrypoints.api_server"], True), (["python3.11", "-m", "vllm"], True),
    (["podman", "run", "docker.io/vllm/vllm-openai"], True),
    (["python3", "train.py"], False), (["python", "-m", "http.server"], False), (["python", "-m"], False),
    (["docker", "run", "ubuntu"], False), (["docker", "logs", "vllm"], False),
    (["vllm.log"], False), (["HF_HOME=/x"], False), ([], False),
])
def test_what_counts_as_a_launch_command(words, is_command):
    assert is_launch_command(words) is is_command


# ------------------------------------------------------------------ explain

def test_explain_is_case_insensitive_with_a_did_you_mean():
    assert run_cli("explain", "PORT-IN-USE").stdout.decode().startswith("port-in-use — ")
    assert "did you mean 'tp-heads-indivisible'?" in one_line_error(run_cli("explain", "TP-Heads"))
    assert "did you mean 'port-in-use'?" in one_line_error(run_cli("explain", "port-in-us"))
    assert "`vllm-doctor rules` lists them" in one_line_error(run_cli("explain", "qqqqqq"))


# ------------------------------------------------------------------ help

def _help(*argv: str) -> str:
    proc = run_cli(*argv, "--help")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode()


def _parser_for(sub: str):
    if sub == "diagnose":
        return _diagnose_parser()
    return _sub_parser(sub)[0]


def test_every_sub_command_has_its_own_help_with_examples():
    main_help = _help()
    assert "vllm serve MODEL -tp 4 2>&1 | vllm-doctor" in main_help and "sub-commands" in main_help
    pages = {sub: _help(sub) for sub in SUBS}
    assert len(set(pages.values()) | {main_help}) == len(SUBS) + 1
    for sub, page in pages.items():
        assert page.startswith(f"usage: vllm-doctor {sub}"), sub
        description = page.split("\n\n")[1]
        assert len(description.split()) >= 6, (sub, description)   # says what it does
        examples = page.split("examples:\n", 1)[1].splitlines()
        examples = [e for e in examples if f"vllm-doctor {sub}" in e]
        assert 2 <= len(examples) <= 4, (sub, examples)
        known = _parser_for(sub)._option_string_actions
        for example in examples:
            # every option an example uses exists (up to where the server's own command line starts)
            ours = re.split(r" -- | \| | > |  \(", example.split(f"vllm-doctor {sub}", 1)[1])[0]
            for word in shlex.split(ours):
                if word.startswith("--"):
                    assert word.split("=")[0] in known, (sub, example)


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_fifo_argument_is_read_as_a_saved_log(tmp_path, compressed):
    """`vllm-doctor <(kubectl logs pod)` hands over a FIFO: it was refused as 'not seekable'."""
    import threading

    fifo = tmp_path / "logs"
    os.mkfifo(fifo)
    data = EXAMPLE.read_bytes()
    data = gzip.compress(data) if compressed else data

    def writer() -> None:
        with open(fifo, "wb") as out:     # opens once the doctor opens the read end
            out.write(data)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    proc = run_cli("--no-live", str(fifo), timeout=120)
    thread.join(10)
    assert proc.returncode == 1, proc.stderr.decode()
    assert "error[tp-heads-indivisible]" in proc.stdout.decode()


def test_each_mode_helps_with_its_own_options():
    """`check`, `run` and `tui` describe the shared options as they mean there, and leave out those they have
    no use for (still accepted: one option set may be passed to several modes)."""
    import os
    import subprocess
    import sys

    def helped(*argv: str) -> str:
        env = dict(os.environ, COLUMNS="200")
        return subprocess.run([sys.executable, "-m", "vllm_doctor", *argv, "--help"], capture_output=True,
                              env=env, timeout=60).stdout.decode()

    check, run, tui, logs = helped("check"), helped("run"), helped("tui"), helped()
    assert "--all-runs" not in check and "  --live " not in check and "the launch command to check" in check
    assert "machine the command will run on" in check and "that wrote the log" not in check
    assert "  --live " not in run and "to name in fixes" in run
    assert "  --format " not in tui and "--command-only" not in tui
    assert "  --live " in logs and "--all-runs" in logs and "the command that produced the log" in logs
    from conftest import run_cli

    assert run_cli("check", "--all-runs", "--no-live", "--", "vllm", "serve", "m", "-tp", "0").returncode == 2


def test_nvmls_own_error_is_not_the_last_word_of_a_report():
    """A log diagnosed with this machine's facts where NVML is missing: its error changes no answer, so only -v
    shows it (a finding that needs GPU facts says so itself: "GPU facts: none here")."""
    from conftest import run_cli
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.nvml import collect_gpu_facts

    facts = Facts()
    collect_gpu_facts(facts, None)
    error = facts.get("gpu.nvml_error")
    log = "logs_corpus/real/healthy/th01-v1-llm-exit-zmq-context-terminated.log"
    plain = run_cli("--live", log).stdout.decode()
    assert "NVML library" not in plain and "nvidia-ml-py" not in plain
    if error:                                  # this machine has no NVML: -v says why there are no GPU facts
        assert error.split(":")[0] in " ".join(run_cli("--live", "-v", log).stdout.decode().split())


def test_every_text_output_fits_80_columns():
    """At COLUMNS=80: the report, check, plan, facts, rules and explain; only a command to copy (run:, was:,
    edit:, change:, plan's best command) or a single unbreakable word (a URL) may be wider."""
    import os
    import subprocess
    import sys

    runs = [["--no-live", "logs_corpus/parallel/v092-red-herring-then-heads.log"],
            ["--no-live", "-v", "logs_corpus/real/memory/rm22-other-streaming-quant-peak-load.log"],
            ["--no-live", "-v", "--cmd", "python -m vllm.entrypoints.openai.api_server --model "   # a long fact
             "Qwen/Qwen2-72B-Instruct-GPTQ-Int4 --tensor-parallel-size 8", "logs_corpus/parallel/v060-marlin-qwen72b-gptq-tp8.log"],
            ["check", "--gpus", "4", "--gpu-memory", "24", "--", "vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct", "-tp", "4"],
            ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpus", "8", "--gpu-memory", "80"],
            ["facts"], ["rules"], ["explain", "nccl-network"]]
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    for argv in runs:
        out = subprocess.run([sys.executable, "-m", "vllm_doctor", *argv], capture_output=True, env=env,
                             timeout=120).stdout.decode()
        for line in out.splitlines():
            if len(line) <= 80 or line.lstrip().startswith(("run: ", "was: ", "edit: ", "change: ", "vllm serve ",
                                                            "otherwise run: ", "otherwise change: ")):
                continue
            assert " " not in line.strip(), (argv, line)      # one word wider than the terminal: a URL


def test_every_help_fits_80_columns_but_its_examples():
    """--help of every mode at COLUMNS=80: the description wraps; only an example command (kept as typed, to
    copy) may be wider."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    for mode in ([], ["check"], ["plan"], ["run"], ["facts"], ["rules"], ["explain"], ["tui"], ["health"]):
        out = subprocess.run([sys.executable, "-m", "vllm_doctor", *mode, "--help"], capture_output=True, env=env,
                             timeout=120).stdout.decode()
        examples = False
        for line in out.splitlines():
            examples = examples or line.rstrip().endswith(("examples:", "Examples:"))
            assert len(line) <= 80 or (examples and line.startswith("  ")), (mode, line)
