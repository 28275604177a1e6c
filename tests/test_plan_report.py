"""`vllm-doctor plan` as a person reads it: no columns of unknowns, rows that do not fit hidden unless
asked, "best" only for a layout that fits, and when nothing fits the arithmetic and changes that do fit
(each checked here by planning again with that change)."""
import json
import re

import pytest

from conftest import ROOT, run_cli
from vllm_doctor.checks.plan import build_plan
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.reports.plan_text import render_text, shown_columns, shown_layouts
from vllm_doctor.vllm_math.sizing import GIB

MODELS = ROOT / "tests" / "fixtures" / "models"


def facts_for(model: str, **extra) -> Facts:
    facts = Facts()
    load_model_facts(str(MODELS / model), facts)
    for key, value in extra.items():
        facts.set(key.replace("__", "."), value, "user")
    return facts


def plan(model: str, gpus: int, gib: float | None, mml: int | None = None, **extra):
    return build_plan(facts_for(model, **extra), model, gpus, gib, mml)


def header_row(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("#"))
    return line.split()


def test_unknown_memory_hides_the_memory_columns_and_asks_once():
    result = plan("vicuna-13b", 3, None)
    text = render_text(result, color=False)
    assert "?" not in text
    assert header_row(text) == ["#", "TP", "PP", "GPUs", "weights/GPU", "notes"]
    assert sum("--gpu-memory GiB" in line for line in text.splitlines()) == 1
    assert "best:" not in text and "first choice (memory fit not checked):" in text
    assert len([ln for ln in text.splitlines() if re.match(r"\d+\s+\d+\s+\d+\s", ln)]) == len(result.layouts)


def test_unknown_weights_hides_the_weights_column_too():
    result = plan("vicuna-13b", 2, None)
    for lay in result.layouts:
        lay.weights_per_gpu = None                  # as with a config too sparse to estimate the weights
    assert [h for h, _ in shown_columns(result.layouts)] == ["TP", "PP", "GPUs", "notes"]
    assert "?" not in render_text(result, color=False)


def test_layouts_that_do_not_fit_are_hidden_unless_asked():
    result = plan("vicuna-13b", 2, 24.0)
    fit = [lay for lay in result.layouts if lay.fits]
    misfit = [lay for lay in result.layouts if lay.fits is False]
    assert fit and misfit
    rows, hidden, staged = shown_layouts(result, show_all=False)
    assert rows == fit and hidden == len(misfit) and staged == 0
    text = render_text(result, color=False)
    assert f"{len(misfit)} layout" in text and "--all shows" in text
    assert " no " not in text and "best:" in text
    everything = render_text(result, color=False, show_all=True)
    assert "--all shows" not in everything and " no " in everything
    assert len([ln for ln in everything.splitlines() if re.match(r"\d+\s+\d+\s+\d+\s", ln)]) == len(result.layouts)


def test_known_memory_shows_every_memory_column():
    text = render_text(plan("vicuna-13b", 3, 40.0), color=False)
    assert {"KV/GPU", "KV", "tokens", "concurrency"} <= set(header_row(text))
    assert "?" not in text and "best:" in text


def test_nothing_fits_says_why_and_what_would_fit():
    result = plan("deepseek-v3", 2, 24.0)
    text = render_text(result, color=False)
    assert "best" not in text and "nothing fits on 2 GPU(s)" in text
    closest = result.best
    need = closest.weights_per_gpu + closest.overhead_gib + closest.kv_bytes_per_token * result.max_model_len / GIB
    lines = text.splitlines()          # the sentence, wrapped to the width: its continuation lines indented
    at = next(i for i, ln in enumerate(lines) if ln.startswith("nothing fits"))
    line = " ".join([lines[at]] + [ln.strip() for ln in lines[at + 1:] if ln.startswith("  ")][:3])
    assert f"= {need:.1f} GiB per GPU" in line and f"{0.92 * 24:.1f} GiB of each" in line
    assert "would fit:" in text and "3 layouts that do not fit hidden" in text


def test_more_gpus_offered_is_the_fewest_that_fit():
    result = plan("llama-3-70b", 2, 40.0)
    assert result.nothing_fits
    more = next(w for w in result.would_fit if "GPUs of 40.0 GiB" in w)
    n = int(more.split()[0])
    assert plan("llama-3-70b", n, 40.0).best.fits is True
    assert plan("llama-3-70b", n - 1, 40.0).nothing_fits


def test_shorter_context_and_fp8_kv_offered_only_when_they_fit():
    result = plan("qwen2.5-7b", 1, 24.0, 131072)
    assert result.nothing_fits
    shorter = next(w for w in result.would_fit if w.startswith("--max-model-len"))
    tokens = int(shorter.split()[1])
    assert plan("qwen2.5-7b", 1, 24.0, tokens).best.fits is True
    assert plan("qwen2.5-7b", 1, 24.0, tokens + 16).nothing_fits
    assert any("--kv-cache-dtype fp8" in w for w in result.would_fit)
    assert plan("qwen2.5-7b", 1, 24.0, 131072, args__kv_cache_dtype="fp8").best.fits is True
    # deepseek-v3's weights do not fit 2 x 24 GiB: no context length or KV dtype can help
    far = plan("deepseek-v3", 2, 24.0)
    assert not any(w.startswith(("--max-model-len", "--kv-cache-dtype")) for w in far.would_fit)


def test_quantized_checkpoint_offered_with_a_size_that_fits():
    result = plan("vicuna-13b", 1, 24.0)
    quant = next(w for w in result.would_fit if "checkpoint" in w)
    gib = float(re.search(r"~(\d+) GiB", quant).group(1))
    assert plan("vicuna-13b", 1, 24.0, model__weight_bytes=int((gib + 0.5) * GIB)).best.fits is True


@pytest.mark.parametrize("args, rc, best", [(["--gpu-memory", "40"], 0, True), (["--gpu-memory", "8"], 1, False)])
def test_cli_json_best_only_when_it_fits(args, rc, best):
    proc = run_cli("plan", str(MODELS / "vicuna-13b"), "--gpus", "2", "--no-live", "--format", "json", *args)
    assert proc.returncode == rc, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["best"] is not None) == best and (data["closest"] is None) == best
    assert bool(data["would_fit"]) == (not best) and (data["shortfall"] is None) == best


def test_cli_all_shows_the_hidden_rows():
    base = ["plan", str(MODELS / "vicuna-13b"), "--gpus", "2", "--gpu-memory", "24", "--no-live"]
    short, full = run_cli(*base).stdout.decode(), run_cli(*base, "--all").stdout.decode()
    assert "--all shows it" in short and "--all shows" not in full
    rows = lambda text: [ln for ln in text.splitlines() if re.match(r"\d+\s+\d+\s+\d+\s", ln)]  # noqa: E731
    assert len(rows(full)) == len(rows(short)) + 1
    assert " no " in full and " no " not in short


@pytest.mark.parametrize("width", [80, 100, 140])
def test_an_8b_model_on_8_gpus_reads_replicas_first_within_the_terminal(width):
    """Qwen3-8B fits one 80 GiB GPU: the first row and the best command are 8 one-GPU replicas, no pipeline
    layout is listed (one line says they are hidden), and every line but the command to copy fits the width."""
    result = plan("qwen3-8b", 8, 80.0)
    text = render_text(result, color=False, width=width)
    lines = text.splitlines()
    rows = [ln.split() for ln in lines if re.match(r"\s*\d+\s+\d+\s+\d+\s", ln)]
    assert rows[0][:4] == ["1", "1", "1", "1"] and all(row[2] == "1" for row in rows), rows
    assert "--data-parallel-size 8" in text and "pipeline-parallel layouts hidden" in text
    best = lines[lines.index("best:") + 1]
    assert best.strip().endswith("--tensor-parallel-size 1 --data-parallel-size 8")
    assert all(len(ln.rstrip()) <= width for ln in lines if ln is not best and "https://" not in ln), text
    staged = render_text(result, color=False, width=width, show_all=True)
    assert "pipeline-parallel layouts hidden" not in staged and re.search(r"^\s*\d+\s+1\s+2\s", staged, re.M)
