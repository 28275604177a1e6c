"""Rule regexes on hostile lines: every search is bounded, and no shipped pattern backtracks.

The lines are built from each rule's own examples (rules/*.toml), 100k characters each: the example
followed by spaces, the example less its last character repeated, its digits blown up to thousands of
digits, and spaces pushed in before its last character (a trailing `.+?\\s*$` met a run of spaces there).
Before the catalog lint (rules/lint.py) and the bounded search (rules/catalog.py Pattern.search), such
lines kept five rules busy for more than 10 s each.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time

import pytest

from conftest import ROOT, run_cli
from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.facts import Facts
from vllm_doctor.rules.catalog import CatalogError, load_catalog, match_text
from vllm_doctor.rules.search import LONG_LINE
from vllm_doctor.rules.lint import lint
from vllm_doctor.sources.lines import parse_line

HANG = 1.0            # seconds: a hang guard, not a speed target (bench/adversarial_bench.py has those)


def _bench():
    """bench/adversarial_bench.py as module `adversarial_bench`: its lines are the ones measured there."""
    if "adversarial_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("adversarial_bench", ROOT / "bench" / "adversarial_bench.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["adversarial_bench"] = module
    return sys.modules["adversarial_bench"]


adversarial_lines = _bench().adversarial_lines


def diagnose(catalog, lines: list[str]):
    """The engine's diagnosis of `lines` (no scanner: every line reaches it; its notices are its own)."""
    diagnoser = Diagnoser(catalog, Facts())
    for n, text in enumerate(lines, 1):
        diagnoser.feed(parse_line(text, "hostile.log", n))
    diagnoser.lines = len(lines)
    return diagnoser.finish()


def _rule_ids():
    return sorted(p.stem for p in (ROOT / "rules").glob("[!_]*.toml"))


@pytest.mark.parametrize("rule_id", _rule_ids())
def test_adversarial_lines_are_answered(catalog, rule_id):
    """Each line read (parsed, matched) within HANG, then the log's end (arbitration, the retyped-phrase
    search over the last error lines, the remedies) within HANG too."""
    diagnoser, slow = Diagnoser(catalog, Facts()), []
    for example in catalog.rules[rule_id].examples:
        for kind, text in adversarial_lines(example["text"]):
            start = time.process_time()
            diagnoser.feed(parse_line(text, "hostile.log", diagnoser.lines + 1))
            diagnoser.lines += 1
            if time.process_time() - start > HANG:
                slow.append(f"{kind} of {example['text'][:60]!r}: {time.process_time() - start:.1f} s")
    start = time.process_time()
    diagnosis = diagnoser.finish()
    assert time.process_time() - start < HANG
    assert not slow, slow
    assert diagnosis.notices == []          # no search ran out of time: the patterns are linear, lines windowed
    assert diagnosis.findings


def test_shipped_catalog_passes_the_lint(catalog):
    problems = [f"{p.rule_id}/{p.name}: {msg}" for p in catalog.patterns for msg in lint(p.source, p.ignorecase)]
    problems += [f"wrapper {w}: {msg}" for w in catalog.wrapper_sources for msg in lint(w)]
    assert problems == []


@pytest.mark.parametrize("source", [
    r"(a+)+", r"(\s*\w+)*", r"(\w+\s?)*$", r"x\s*\s*", r"x.*\s+.*", r"x\w+\d+", r"x(a|ab)*c",
    r"failed ?: (?P<os_error>.+?)\s*$",                     # nccl-network's, before this lint
    r"\.\.*?Error (?P<n>\d+): (?P<e>.+?)\s*$",              # no-gpu's cudaGetDeviceCount, before
    r"x.*(?:foo)?.*", r"_\w*C[\w.\-]*\.so", r"(?P<n>\d+) is not divisible",
    r"x(?:a+){e<=1}+y",                                     # the regex module's fuzzy syntax around it
])
def test_lint_refuses_backtracking(source):
    problems = lint(source)
    assert problems and "{0,200}" in problems[0], problems


@pytest.mark.parametrize("source", [
    r"failed ?: (?P<os_error>.*\S)\s*$", r"argument (?P<flag>--[\w-]+)(?:/-[^\s/:]+)*: ",
    r"NET/Socket : Using (?P<socket_ifs>(?:\[\d+\][^:\s]+:[0-9a-fA-F.:%\w]+<\d+>\s*)+)",
    r"Detected different devices in the system:\s*(?P<d>(?:\S[^\n]*?)?)(?:\.\s*Please make sure|$)",
    r"x\s{0,200}\s*", r"(?<!\S)(?P<model>\S+) is not a local folder", r"x(?:NV\d+|PIX|PXB|SYS)\s+",
    r"x(?P<e>a)|(?P<e>b)",                                   # a group name twice: the regex module's syntax
])
def test_lint_accepts_linear_patterns(source):
    assert lint(source) == []


def _rule(regex: str) -> str:
    # the pydantic-literal example of cli-invalid-choice, with the planted regex
    return ('id = "planted"\ntitle = "t"\nseverity = "error"\nfamily = "config"\nsummary = "s"\n'
            'explanation = "e"\n[[patterns]]\nname = "words"\nliteral = "Input should be "\n'
            f"regex = '''{regex}'''\n"
            "[[examples]]\ntext = \"  Input should be 'auto', 'half', 'float16' [type=literal_error, "
            "input_value='f16', input_type=str]\"\n[[counterexamples]]\ntext = \"Input should be\"\n")


def test_planted_catastrophic_pattern_is_refused(tmp_path):
    (tmp_path / "planted.toml").write_text(_rule(r"(\w+\s?)*$"))
    with pytest.raises(CatalogError, match=r"planted\.toml: rule 'planted', pattern 'words' can backtrack"):
        load_catalog(tmp_path)
    log = tmp_path / "v.log"
    log.write_text("INFO 05-01 12:00:00 [api_server.py:1] vLLM API server version 0.6.3\n")
    proc = run_cli("--no-live", "--rules-dir", str(tmp_path), str(log))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("vllm-doctor: ") and "planted.toml" in err, err
    assert "{0,200}" in err and "Traceback" not in err


def _stale(catalog, rule_id: str, name: str, source: str):
    """`catalog` with one pattern's regex replaced behind the lint's back, as a catalog cached before the
    lint existed would hold it."""
    pattern = next(p for p in catalog.rules[rule_id].patterns if p.name == name)
    pattern.source, pattern._compiled = source, None
    return catalog


def test_a_search_out_of_time_is_no_match_and_one_notice(tmp_path):
    # nccl-network's socket-connect-failed as it shipped before the lint: quadratic in a run of spaces
    catalog = _stale(load_catalog(ROOT / "rules"), "nccl-network", "socket-connect-failed",
                     r"(?:socketStartConnect: |Net : |NCCL WARN )Connect to (?P<peer_addr>[\[\]0-9a-fA-F.:%\w]+"
                     r"<\d+>) failed ?: (?P<os_error>.+?)\s*$")
    example = catalog.rules["nccl-network"].examples[2]["text"]       # socketStartConnect: Connect to ...
    assert "socketStartConnect: Connect to" in example
    # spaces pushed in before its last character, within LONG_LINE: no window, the timeout alone bounds it
    line = example[:-1] + " " * (LONG_LINE - len(example) - 1) + example[-1]
    start = time.process_time()
    diagnosis = diagnose(catalog, [line, line, line])
    assert time.process_time() - start < HANG
    notes = [n for n in diagnosis.notices if "nccl-network" in n]
    assert notes == ["rule nccl-network: 3 lines not matched: its regex ran past 5 ms on them (a pattern that "
                     "backtracks)"], diagnosis.notices


def test_a_long_line_is_matched_in_a_window_around_its_literal(catalog):
    # the cli-invalid-choice example, 1 MB of spaces either side: found, with its captures, at a 4 KiB cost
    example = catalog.rules["cli-invalid-choice"].examples[0]["text"]
    pad = " " * 1_000_000
    diagnosis = diagnose(catalog, [pad + example + pad])
    assert [f.rule for f in diagnosis.findings] == ["cli-invalid-choice"]
    assert diagnosis.findings[0].facts["value"] == "torch.float16"


def test_a_window_end_is_not_the_line_end(catalog):
    # cli-unknown-arg's tokens run to the line's end (`\s*$`): a window that ends inside a long line must
    # not take its own end for the line's (the tokens would be cut short, and the fix drop half a flag)
    example = catalog.rules["cli-unknown-arg"].examples[0]["text"]      # vllm: error: unrecognized arguments: ...
    short = diagnose(catalog, [example + " --max-num-seqs 256" * 100])          # 1.9 KB: searched whole
    assert [(f.rule, str(f.facts["tokens"])[-20:]) for f in short.findings] == [
        ("cli-unknown-arg", "6 --max-num-seqs 256")]
    long = diagnose(catalog, [example + " --max-num-seqs 256" * 1000])          # 19 KB: in windows
    assert [f.rule for f in long.findings] == ["unrecognized"]               # the argparse error, as is


def test_a_megabyte_line_costs_a_window(catalog):
    # the cli-invalid-choice example less its closing parenthesis, repeated to 1 MB: every copy starts a
    # search whose `(?P<choices>.*?)\)` runs to the end; in windows it is 4 KiB each, nothing runs out of time
    example = catalog.rules["cli-invalid-choice"].examples[0]["text"]
    line = (example[:-1] * (1_000_000 // len(example) + 1))[:1_000_000]
    start = time.process_time()
    diagnosis = diagnose(catalog, [line])
    assert time.process_time() - start < HANG
    assert diagnosis.notices == []


def test_the_retyped_phrase_search_is_bounded(catalog):
    # nccl-network's TCPStore example less its final '.', repeated to 100k: no rule matches it, so the
    # retyped-phrase search (rules/fuzzy.py) reads it; its edited search of the whole pattern used to run
    # out of time and raise (`vllm-doctor: error: TimeoutError: regex timed out`, exit 2)
    line = dict(adversarial_lines(_example(catalog, "nccl-network", "tcpstore-connect")))["repeat"]
    start = time.process_time()
    diagnosis = diagnose(catalog, [line])
    assert time.process_time() - start < HANG
    assert [f.rule for f in diagnosis.findings] == ["unrecognized"]


def _example(catalog, rule_id: str, pattern: str) -> str:
    return next(ex["text"] for ex in catalog.rules[rule_id].examples
                if (got := match_text(catalog.rules[rule_id], ex["text"])) and got[0].name == pattern)


@pytest.mark.parametrize("rule_id, pattern, kind", [
    ("cli-invalid-choice", "pydantic-literal", "repeat"), ("cli-unknown-arg", "argparse", "gap"),
    ("nccl-network", "socket-connect-failed", "gap"), ("nccl-p2p", "topo-row", "repeat"),
    ("no-gpu", "cuda-get-device-count", "repeat")])
def test_adversarial_lines_through_the_cli(tmp_path, catalog, rule_id, pattern, kind):
    line = dict(adversarial_lines(_example(catalog, rule_id, pattern)))[kind]
    log = tmp_path / "hostile.log"
    log.write_text(line + "\n")
    proc = run_cli("--no-live", "--format", "json", str(log), timeout=10)     # it took > 10 s before
    assert proc.returncode in (0, 1), proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()
    json.loads(proc.stdout)
