"""No test can hang CI: every child process a test starts is waited for with a timeout."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
RUNNERS = {"run", "call", "check_call", "check_output"}   # subprocess functions that wait for the child
WAITS = {"communicate"}                                    # Popen methods that wait without a deadline


def _unbounded(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        named = {k.arg for k in node.keywords}
        if any(k.arg is None for k in node.keywords):       # **kwargs: may carry the timeout
            continue
        waits_for_child = (
            (func.attr in RUNNERS and isinstance(func.value, ast.Name) and func.value.id == "subprocess")
            or func.attr in WAITS)
        if waits_for_child and "timeout" not in named:
            lines.append(node.lineno)
    return lines


def test_every_subprocess_wait_in_the_tests_has_a_timeout():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for line in _unbounded(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(TESTS.parent)}:{line}")
    assert not found, "subprocess calls without timeout= (a hung child would hang CI): " + ", ".join(found)


def test_the_check_sees_a_call_without_a_timeout():
    tree = ast.parse("import subprocess\nsubprocess.run(['true'])\nsubprocess.run(['true'], timeout=5)\n"
                     "p.communicate()\n")
    assert _unbounded(tree) == [2, 4]
