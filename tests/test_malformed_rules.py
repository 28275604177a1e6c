"""A malformed rule catalog (`--rules-dir`, hidden) is a usage error on every sub-command that loads rules:
one line on stderr naming the file, exit 2, no traceback, and nothing started (`run` starts no command).
The pipe alone still copies every byte through: the server upstream is already writing into it.

Each broken catalog is a copy of the shipped rules/ with one real file damaged the way a hand edit
damages it. The matrix runs in forked in-process CLI runs (bench/fuzz.py's `run_forked`); the pipe and
`run` are also checked once through a fresh interpreter.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

LOG = ROOT / "logs_corpus/parallel/vicuna13b-tp3.log"
RULE = "tp-heads-indivisible.toml"


def _bench_fuzz():
    """bench/fuzz.py as module `fuzz` (its forked runner), loaded once."""
    if "fuzz" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fuzz", ROOT / "bench" / "fuzz.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["fuzz"] = module
        spec.loader.exec_module(module)
    return sys.modules["fuzz"]


fuzz = _bench_fuzz()
fuzz.prepare()                 # imported once here, not in every forked run


def _edit(name: str, old: str, new: str, *, regex: bool = False):
    def apply(d: Path) -> None:
        path = d / name
        text = path.read_text(encoding="utf-8")
        changed = re.sub(old, new, text, count=1) if regex else text.replace(old, new, 1)
        assert changed != text, f"{name}: {old!r} not found (the rule file changed?)"
        path.write_text(changed, encoding="utf-8")
    return apply


def _non_utf8(d: Path) -> None:
    path = d / RULE
    path.write_bytes(path.read_bytes().replace(b"Attention heads", b"Attention\xff heads", 1))


def _duplicate(d: Path) -> None:
    shutil.copy(d / RULE, d / "tp-heads-copy.toml")


# (damage, the file the error must name). Each is one edit of the shipped file.
BROKEN = {
    "bad-toml": (_edit(RULE, 'severity = "error"', 'severity = "error'), RULE),         # an unclosed string
    "duplicate-id": (_duplicate, RULE),
    "bad-regex": (_edit(RULE, r"\((?P<heads>\d+)\)", r"\((?P<heads>\d+\)"), RULE),      # a lost parenthesis
    "unknown-remedy": (_edit(RULE, "parallel:fix_tensor_parallel", "parallel:no_such_fix"), RULE),
    "non-utf8": (_non_utf8, RULE),
    "missing-field": (_edit(RULE, r"(?m)^title = .*\n", "", regex=True), RULE),
    "bad-wrapper-regex": (_edit("_wrappers.toml", "regex = '''Engine process failed to start'''",
                                "regex = '''Engine (process failed to start'''"), "_wrappers.toml"),
}
# Type slips TOML accepts but the loader does not check today (reported; the loader raises a bare
# exception, so the user sees a traceback): a string priority, a pattern that is a string, not a table.
UNCHECKED = {
    "priority-not-int": (_edit(RULE, "priority = 90", 'priority = "high"'), RULE),
    "pattern-not-table": (_edit(RULE, r"(?s)\[\[patterns\]\].*", 'patterns = ["Total number of attention heads"]\n',
                                regex=True), RULE),
    "structural-not-list": (_edit("_wrappers.toml", r"(?s)structural_literals = \[.*?\]\n", "structural_literals = 5\n",
                                  regex=True), "_wrappers.toml"),
}


def broken_catalog(tmp_path: Path, case: str, table: dict = BROKEN) -> tuple[Path, str]:
    damage, named = table[case]
    directory = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", directory)
    damage(directory)
    return directory, named


def sub_commands(rules: Path, marker: Path) -> dict[str, tuple[list[str], bytes | None, bool]]:
    """Every sub-command that loads the catalog: (argv, stdin, stdin is a pipe)."""
    r = ["--rules-dir", str(rules)]
    log = LOG.read_bytes()
    return {
        "diagnose-file": (["--no-live", *r, str(LOG)], None, False),
        "diagnose-sub": (["diagnose", "--no-live", *r, str(LOG)], None, False),
        "dash": (["--no-live", *r, "-"], log, True),
        "pipe": (["--no-live", *r], log, True),
        "follow": (["--no-live", *r, "--follow", str(LOG), "--idle-exit", "1"], None, False),
        "run": (["run", "--no-live", *r, "--", "touch", str(marker)], None, False),
        "tui": (["tui", "--no-live", *r, str(LOG)], None, False),
        "check": (["check", "--no-live", *r, "--", "vllm", "serve", "/models/tiny40", "-tp", "3"], None, False),
        "rules": (["rules", *r], None, False),
        "explain": (["explain", *r, "tp-heads-indivisible"], None, False),
    }


def assert_usage_error(outcome, named: str) -> str:
    err = outcome.stderr.decode("utf-8", "replace")
    assert not outcome.hung
    assert "Traceback" not in err, err
    assert outcome.rc == 2, (outcome.rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm-doctor: error: "), err
    assert named in lines[0], err
    return lines[0]


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_every_sub_command_refuses_a_broken_catalog_in_one_line(tmp_path, case):
    rules, named = broken_catalog(tmp_path, case)
    marker = tmp_path / "the-command-ran"
    for name, (argv, stdin, pipe) in sub_commands(rules, marker).items():
        outcome = fuzz.run_forked(argv, stdin, pipe, str(tmp_path), timeout=30)
        line = assert_usage_error(outcome, named)
        # the pipe owes the server its output: every byte still passes (then exit 2); nothing else
        # copies or reports anything once the catalog is known to be broken
        expected = stdin if name == "pipe" else b""
        assert outcome.stdout == expected, (name, len(outcome.stdout))
        assert not marker.exists(), (name, "`run` started the command although its catalog is broken")
        assert "report written" not in line


def test_a_broken_catalog_never_costs_the_pipe_a_byte(tmp_path):
    """The decision for the pipe: in `vllm serve … 2>&1 | vllm-doctor --rules-dir BAD` the server is already
    writing into us, so the error is said once, at once, and the server's output still passes through byte
    for byte (then exit 2). A fresh interpreter, stdin a real pipe. `run` has started nothing yet: it
    refuses before starting the command."""
    rules, named = broken_catalog(tmp_path, "bad-regex")
    data = LOG.read_bytes() + bytes(range(256)) + b"\r\nno newline at the end"
    proc = run_cli("--no-live", "--rules-dir", str(rules), input=data)
    assert proc.returncode == 2 and proc.stdout == data
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and named in err and "does not compile" in err, err
    marker = tmp_path / "ran"
    proc = run_cli("run", "--no-live", "--rules-dir", str(rules), "--", "touch", str(marker))
    assert proc.returncode == 2 and not marker.exists(), proc.stderr


def test_the_messages_name_the_problem(tmp_path):
    """What each line says (file mode), so a user can fix the file without reading the loader."""
    expected = {"bad-toml": "not valid TOML", "duplicate-id": "duplicate rule id 'tp-heads-indivisible'",
                "bad-regex": "pattern 'config-check' does not compile", "unknown-remedy": "no function no_such_fix",
                "non-utf8": "not valid TOML", "missing-field": "missing title",
                "bad-wrapper-regex": "bad wrapper entry"}
    for case, words in expected.items():
        rules, named = broken_catalog(tmp_path / case, case)
        outcome = fuzz.run_forked(["--no-live", "--rules-dir", str(rules), str(LOG)], None, False, str(tmp_path), 30)
        assert words in assert_usage_error(outcome, named), case


@pytest.mark.parametrize("case", sorted(UNCHECKED))
def test_type_slips_in_a_rule_file_are_one_line_too(tmp_path, case):
    rules, named = broken_catalog(tmp_path, case, UNCHECKED)
    for argv in (["--no-live", "--rules-dir", str(rules), str(LOG)], ["rules", "--rules-dir", str(rules)]):
        assert_usage_error(fuzz.run_forked(argv, None, False, str(tmp_path), 30), named)


def test_a_rules_directory_without_rules_is_refused(tmp_path):
    empty = tmp_path / "rules"
    empty.mkdir()
    outcome = fuzz.run_forked(["--no-live", "--rules-dir", str(empty), str(LOG)], None, False, str(tmp_path), 30)
    assert_usage_error(outcome, str(empty))


def test_a_rules_directory_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-rules"
    outcome = fuzz.run_forked(["rules", "--rules-dir", str(missing)], None, False, str(tmp_path), 30)
    assert "rules directory not found" in assert_usage_error(outcome, str(missing))
