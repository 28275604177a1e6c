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


def test_the_newest_release_s_flags_are_known_and_dated():
    """The flag data describes vLLM 0.34.0 (its real parser's option strings): a flag 0.34.0 added is known at
    the newest release (a user of 0.34 is not told it is unknown) and dated from 0.34.0, so a launch for 0.33.0
    is told it does not exist there; every option string of the reference dump is known at HEAD."""
    from vllm_doctor.command import flags, versions

    assert versions.HEAD == "0.34.0"
    for flag in ("--shuffle-safetensors-files", "--max-num-inflight-kv-loads"):
        assert flags.is_known(flag) and flags.is_known(flag, "0.34.0")
        assert not flags.is_known(flag, "0.33.0")
    dump = [ln.strip() for ln in (REFERENCE / "vllm-flags.txt").read_text().splitlines() if ln.startswith("-")]
    assert len(dump) > 400 and all(flags.is_known(f) for f in dump)
