"""The script and CI outputs (reports/concise.py, diagnosis/ignore.py): `--format concise`, `--format github`,
`-q/--command-only` and `--ignore RULE`, through the CLI as a user runs them."""
import json

from conftest import run_cli

TP3 = "logs_corpus/parallel/vicuna13b-tp3.log"
RED_HERRING = "logs_corpus/parallel/v092-red-herring-then-heads.log"
HEALTHY = "logs_corpus/real/healthy"


def _healthy_log() -> str:
    from pathlib import Path

    return str(sorted(Path(HEALTHY).glob("*.log"))[0])


def test_concise_is_one_line_per_finding_with_its_place_and_fix():
    proc = run_cli("--no-live", "--format", "concise", RED_HERRING)
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert lines[0] == (f"{RED_HERRING}:22:16: error[tp-heads-indivisible]: Attention heads not divisible by the "
                        "tensor-parallel size; fix: --tensor-parallel-size 6 -> 4")
    proc = run_cli("--no-live", "--format", "concise", _healthy_log())
    assert (proc.returncode, proc.stdout) == (0, b"")


def test_github_annotations_point_at_the_log_line_and_escape_what_github_reads():
    proc = run_cli("--no-live", "--format", "github", TP3)
    (line,) = proc.stdout.decode().splitlines()
    assert proc.returncode == 1 and line.startswith(f"::error file={TP3},line=35,col=16,title=vllm-doctor "
                                                    "tp-heads-indivisible%3A Attention heads"), line
    message = line.split("::", 2)[2]
    assert "%0Arun: vllm serve lmsys/vicuna-13b-v1.5 --tensor-parallel-size " in message and "\n" not in message
    from vllm_doctor.reports.concise import _escape

    assert _escape("a,b: 100%\nc", prop=True) == "a%2Cb%3A 100%25%0Ac" and _escape("a,b: c") == "a,b: c"


def test_command_only_prints_just_the_corrected_command():
    proc = run_cli("--no-live", "-q", TP3)
    assert proc.returncode == 1 and proc.stderr == b""
    fix = json.loads(run_cli("--no-live", "--format", "json", TP3).stdout)["combined_fix"]["command"]
    assert proc.stdout.decode() == fix + "\n" and fix.startswith("vllm serve lmsys/vicuna-13b-v1.5 --tensor-parallel-size ")
    # no launch line: nothing to paste on stdout, the reason on stderr, the verdict in the exit code
    proc = run_cli("--no-live", "--command-only", "logs_corpus/real/memory/rm22-other-streaming-quant-peak-load.log")
    assert (proc.returncode, proc.stdout) == (1, b"") and b"no command to print (cuda-oom-load)" in proc.stderr
    proc = run_cli("--no-live", "-q", _healthy_log())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    proc = run_cli("check", "--gpus", "4", "--gpu-memory", "40", "-q", "--", "vllm", "serve",
                   "lmsys/vicuna-13b-v1.5", "-tp", "3")
    assert proc.returncode == 1 and proc.stdout.decode().startswith("vllm serve lmsys/vicuna-13b-v1.5 -tp "), proc


def test_ignore_leaves_a_rule_out_says_so_and_the_exit_code_follows():
    proc = run_cli("--no-live", "--ignore", "TP-Heads-Indivisible", RED_HERRING)
    out = proc.stdout.decode()
    assert proc.returncode == 0 and "nothing left to report" in out and "1 finding not shown (--ignore)" in out
    assert "no problem found" not in out
    report = json.loads(run_cli("--no-live", "--format", "json", "--ignore", "port-in-use,tp-heads-indivisible",
                                RED_HERRING).stdout)
    assert report["findings"] == [] and report["ignored"] == 1 and report["combined_fix"] is None
    proc = run_cli("--no-live", "--ignore", "tp-heads-indivisable", RED_HERRING)
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode().strip() == ("vllm-doctor: error: --ignore: no rule 'tp-heads-indivisable'; did you "
                                            "mean 'tp-heads-indivisible'?")
    # the pipe: never told live either, and the final report leaves it out
    with open(RED_HERRING, "rb") as f:
        data = f.read()
    proc = run_cli("--ignore", "tp-heads-indivisible", "--no-live", input=data)
    assert proc.returncode == 0 and proc.stdout == data, proc.stderr
    assert b"tp-heads-indivisible" not in proc.stderr and b"1 finding not shown (--ignore)" in proc.stderr
