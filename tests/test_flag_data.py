"""The committed flag data is what build_flags.py makes from docs/reference/ (copies of the team's notes)."""
import subprocess
import sys

from conftest import REFERENCE, ROOT


def test_versions_json_regenerates_from_docs_reference(tmp_path):
    [script] = ROOT.glob("src/**/build_flags.py")
    proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "versions.json").read_text() == (script.parent / "versions.json").read_text()
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    subprocess.run([sys.executable, str(script), str(REFERENCE), "--out", str(explicit)], check=True,
                   capture_output=True, timeout=60)
    assert (explicit / "versions.json").read_text() == (tmp_path / "versions.json").read_text()


def test_an_environment_variable_passed_as_a_flag_is_set_as_one():
    """`--cpu-kvcache-space 8` is no flag of any release, but VLLM_CPU_KVCACHE_SPACE is a variable vLLM reads
    (vllm/envs.py): the fix sets it instead of only dropping the flag; a variable a release no longer has is
    not offered for it, and a word that names none stays a plain unknown flag."""
    from conftest import run_cli
    from vllm_doctor.command.flags import env_var_for

    assert env_var_for("--cpu-kvcache-space") == "VLLM_CPU_KVCACHE_SPACE"
    assert env_var_for("--cpu_kvcache_space=8", "0.8.5") == "VLLM_CPU_KVCACHE_SPACE"
    assert env_var_for("--use-v1", "0.9.2") == "VLLM_USE_V1" and env_var_for("--use-v1", "0.30.0") is None
    assert env_var_for("--vllm-host-ip") == "VLLM_HOST_IP" and env_var_for("--no-such-thing") is None
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "cpu.log"
        log.write_text("$ vllm serve Qwen/Qwen2.5-0.5B --cpu-kvcache-space 8\n"
                       "vllm serve: error: unrecognized arguments: --cpu-kvcache-space 8\n")
        out = run_cli("--no-live", "-q", str(log)).stdout.decode()
    assert out == "VLLM_CPU_KVCACHE_SPACE=8 vllm serve Qwen/Qwen2.5-0.5B\n"
