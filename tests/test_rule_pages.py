"""`vllm-doctor explain RULE`: fixed headings in a fixed order, none of the catalog's inner workings."""
import re

import pytest

from conftest import ROOT, run_cli
from vllm_doctor.reports.rule_pages import PAGE_HEADINGS, public_text, rule_page, span_text
from vllm_doctor.rules.catalog import Pattern, Rule

PACKAGE = ROOT / "src" / "vllm_doctor"
# what a `module:function` hook spec can start with, read from the source tree (not from the module under test)
HOOK_MODULES = {p.stem for pkg in ("remedies", "refine") for p in (PACKAGE / pkg).iterdir()
                if not p.name.startswith("_") and (p.suffix == ".py" or p.is_dir())}


def headings(page: str) -> list[str]:
    """Headings as the page underlines them."""
    lines = page.splitlines()
    return [lines[i] for i in range(len(lines) - 1)
            if lines[i] and re.fullmatch(r"-+", lines[i + 1]) and len(lines[i + 1]) == len(lines[i])]


def expected_headings(rule: Rule) -> list[str]:
    want = ["What it means"]
    if rule.explanation.strip():
        want.append("Why vLLM checks it")
    if rule.examples:
        want.append("Example")
    want.append("How the fix is chosen")
    if rule.versions or any(p.versions for p in rule.patterns):
        want.append("Versions")
    return want


def test_every_page_has_its_headings_in_the_fixed_order(catalog):
    assert len(catalog.rules) > 10
    for rule in catalog.rules.values():
        page = rule_page(rule)
        got = headings(page)
        assert got == expected_headings(rule), (rule.id, got)
        assert [h for h in PAGE_HEADINGS if h in got] == got       # never out of order
        assert page.startswith(f"{rule.id} — {rule.title}\n")
        assert rule.summary.strip() in page
        assert rule.examples[0]["text"].strip() in page


def _asides(text: str) -> list[str]:
    return re.findall(r"\(([^()]*)\)", text)


def test_no_page_shows_internal_names(catalog):
    for rule in catalog.rules.values():
        page = rule_page(rule)
        assert not re.search(r"\bpriority\b", page, re.I), rule.id
        assert "vllm_doctor" not in page, rule.id
        for spec in (rule.remedy, rule.refine):
            assert not spec or spec not in page, (rule.id, spec)
        hooks = [m.group(0) for m in re.finditer(r"\b([a-z_]+):([a-z_]\w*)\b", page) if m.group(1) in HOOK_MODULES]
        assert not hooks, (rule.id, hooks)
        assert "(fatal)" not in page and "(warning)" not in page, rule.id
        names = {p.name for p in rule.patterns}
        raw = " ".join([rule.summary, rule.explanation, rule.fix_method]
                       + [e["text"] for e in rule.examples] + [p.literal for p in rule.patterns])
        for name in names:
            # a pattern's name shows only where the rule's own words or log lines use the same word
            word = re.compile(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])")
            assert len(word.findall(page)) <= len(word.findall(raw)), (rule.id, name)
        def is_name(word: str) -> bool:
            return word in names or (word.endswith("*") and any(n.startswith(word[:-1]) for n in names))

        for aside in _asides(page):
            words = [w for w in re.split(r"[\s,;/]+", aside) if w and w not in ("patterns", "pattern", "and", "or")]
            assert not (words and all(is_name(w) for w in words)), (rule.id, aside)


def _rule(**extra) -> Rule:
    # Pattern(rule id, name, literal, regex source, ...)
    patterns = [Pattern("demo", "errno", "Address already in use", r"\[Errno 98\] Address already in use"),
                Pattern("demo", "uvicorn", "address already in use", r"bind on address.*address already in use",
                        versions="0.5.4..HEAD"),
                Pattern("demo", "tcpstore-bind", "failed to bind", r"failed to bind to \S+")]
    fields = dict(id="demo", title="Demo", severity="error", family="config", summary="A demo rule.",
                  explanation="", fix_method="", remedy="ports:fix_port_in_use", patterns=patterns,
                  examples=[{"text": "OSError: [Errno 98] Address already in use", "pattern": "errno"}])
    fields.update(extra)
    return Rule(**fields)


def test_asides_naming_patterns_or_hooks_are_dropped_and_others_kept():
    rule = _rule()
    text = ("HTTP socket (patterns errno, uvicorn): another `--port`. TCPStore (tcpstore*): another port. "
            "Old logs (relabelled by memory:oom_phase) too. Half precision (a small risk for models trained in "
            "errno mode) stays. `bind to [::]:29500 (errno: 98 - Address already in use)` stays.")
    out = public_text(text, rule)
    assert "HTTP socket: another `--port`." in out and "TCPStore: another port." in out
    assert "oom_phase" not in out and "Old logs too." in out
    assert "(a small risk for models trained in errno mode)" in out
    assert "(errno: 98 - Address already in use)" in out


def test_fallbacks_say_what_the_rule_file_lacks_without_inventing():
    bare = _rule(remedy=None, versions="", examples=[],
                 patterns=[Pattern("demo", "errno", "Address already in use", r"Address already in use")])
    page = rule_page(bare)
    assert headings(page) == ["What it means", "How the fix is chosen"]
    assert "No automatic fix" in page
    computed = rule_page(_rule(versions="0.1.7..HEAD"))
    assert "does not describe how" in computed and "fix_port_in_use" not in computed
    assert "Printed by vLLM 0.1.7 and later." in computed
    # the narrower pattern is named by the words it is found by, not by its name
    assert 'vLLM 0.5.4 and later: a line containing "address already in use"' in computed
    assert "uvicorn" not in computed


@pytest.mark.parametrize("text, shown", [
    ("0.5.4..HEAD", "vLLM 0.5.4 and later"), ("0.8.0..0.10.2", "vLLM 0.8.0 to 0.10.2"),
    ("torch 2.1..2.14", "torch 2.1 to 2.14"), ("something else", "something else"),
])
def test_version_ranges_read_as_words(text, shown):
    assert span_text(text) == shown


def test_explain_prints_the_page_in_any_case():
    proc = run_cli("explain", "TP-Heads-Indivisible")
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout.decode()
    assert page.startswith("tp-heads-indivisible — ") and headings(page)[0] == "What it means"


def test_every_page_and_the_rule_list_fit_80_columns():
    """`explain` and `rules` at the terminal's width: prose reflowed, log lines wrapped under their indent; only a
    single word wider than the width (a URL) may stick out. The text itself is the page's, word for word."""
    import os
    import subprocess
    import sys

    from vllm_doctor.reports.rule_pages import fit_page, rule_page, rules_text
    from vllm_doctor.rules.catalog import load_catalog

    catalog = load_catalog(ROOT / "rules")
    for rule in catalog.rules.values():
        page = rule_page(rule)
        fitted = fit_page(page, 80)
        words = lambda text: [w for w in text.split() if not set(w) <= {"=", "-"}]  # noqa: E731 (underlines)
        assert words(fitted) == words(page), rule.id
        assert all(len(ln) <= 80 or " " not in ln.strip() for ln in fitted.splitlines()), rule.id
    listed = rules_text(sorted(catalog.rules.values(), key=lambda r: r.id), 80)
    assert all(len(ln) <= 80 for ln in listed.splitlines()) and len(listed.split("\n")) > len(catalog.rules)
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    for argv in (["rules"], ["explain", "nccl-shm"]):
        out = subprocess.run([sys.executable, "-m", "vllm_doctor", *argv], capture_output=True, env=env,
                             timeout=60).stdout
        assert max(len(ln) for ln in out.decode().splitlines()) <= 80, argv
