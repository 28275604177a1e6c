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
