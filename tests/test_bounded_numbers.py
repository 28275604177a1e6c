"""Bounded numbers and bounded work: a number from a log, a command, a config.json, a snapshot or an option
is parsed by vllm_doctor.numbers (too many digits, NaN, ±inf: not a number, never an exception), every loop
over sizes stops at the GPUs that can exist, the JSON out is strict, and a failing fact source costs its
facts only.

Inputs are real lines with their numbers blown up: logs_corpus/parallel/v061-divide-kv-8-by-5.log (the
`[rank0]:` and `(VllmWorkerProcess pid=6120)` prefixes, a traceback, `AssertionError: 8 is not divisible by
5`), logs_corpus/parallel/v0130-world-size-8-gpus-4.log (`World size (8) is larger than the number of
available GPUs (4)`), logs_corpus/real/parallel/rp03-r1-distill-qwen7b-tp8.log (`Total number of attention
heads (28) must be divisible by tensor parallel size (8)`), logs_corpus/config/c28-healthy-with-noise.log's
KV lines, the examples of rules/kv-cache-insufficient.toml and rules/gpu-memory-utilization-too-high.toml.

Each case that used to hang or crash runs under a hang guard (HANG_S, generous: they take ~0.05 s in
process now); bench/bounds_bench.py prints the times.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

from vllm_doctor import numbers as N
from vllm_doctor.diagnosis.saved import Options, diagnose_paths
from vllm_doctor.facts import Facts
from vllm_doctor.facts.gather import gather_facts
from vllm_doctor.vllm_math import parallel as pm

HANG_S = 5.0          # in process: every case below answers in well under 0.5 s
CLI_HANG_S = 15       # a fresh interpreter on two busy cores: start-up included
BIG = "9" * 5000      # past Python's int-from-string limit (sys.get_int_max_str_digits: 4300)
V061 = (ROOT / "logs_corpus/parallel/v061-divide-kv-8-by-5.log").read_text()
WORLD = (ROOT / "logs_corpus/parallel/v0130-world-size-8-gpus-4.log").read_text()
RP03 = (ROOT / "logs_corpus/real/parallel/rp03-r1-distill-qwen7b-tp8.log").read_text()
HEADS_LINE = "Total number of attention heads (28) must be divisible by tensor parallel size (8)"
MODELS = ROOT / "tests/fixtures/models"
# c28-healthy-with-noise.log's KV lines and kv-cache-insufficient.toml's first example, numbers blown up
KV_LINES = (
    f"(APIServer pid=1120) INFO 04-02 08:00:04 [model.py:2152] Using max model len {BIG}\n"
    f"(EngineCore pid=1201) INFO 04-02 08:00:15 [kv_cache_utils.py:1087] GPU KV cache size: {BIG} tokens\n"
    f"(EngineCore pid=1201) INFO 04-02 08:00:15 [kv_cache_utils.py:1091] Maximum concurrency for {BIG} tokens "
    f"per request: {BIG}x\n"
    f"ValueError: The model's max seq len ({BIG}) is larger than the maximum number of tokens that can be stored "
    f"in KV cache ({BIG}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    f"initializing the engine.\n")
FREE_MEMORY = ("ValueError: Free memory on device cuda:0 (19.77/22.05 GiB) on startup is less than desired GPU "
               "memory utilization (0.92, 20.29 GiB). Decrease GPU memory utilization or reduce GPU memory used "
               "by other processes.\n")   # gpu-memory-utilization-too-high.toml's second example, no prefix


def within(fn, *args, seconds: float = HANG_S, **kwargs):
    """fn(*args, **kwargs), failing the test if it is still running after `seconds` (a loop as long as a
    number); the thread is a daemon, so a hang costs the test, not the session."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} still running after {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def diagnose(tmp_path: Path, text: str, catalog, **options):
    path = tmp_path / "vllm.log"
    path.write_text(text)
    return within(diagnose_paths, [str(path)], catalog, Options(live=options.pop("live", False), **options))


def cli(*args, timeout: int = CLI_HANG_S):
    r = run_cli(*args, timeout=timeout)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def one_line_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2 and "Traceback" not in err, err[-2000:]
    assert err.startswith("vllm-doctor: ") and err.count("\n") == 1, err[-2000:]
    for word in words:
        assert word in err, err


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


# --------------------------------------------------------------------------- the one parser

@pytest.mark.parametrize("text", [BIG, "1" * 19, "-" + BIG, "nan", "NaN", "inf", "-inf", "Infinity", "1e999",
                                  "1e18", "٣", "²", "12abc", "", "   "])
def test_what_is_no_number_is_none(text):
    assert N.parse_int(text) is None
    assert N.as_int(text) is None and N.as_float(text) is None


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300, 10 ** 30, True, [1], {}])
def test_non_finite_and_huge_values_are_none(value):
    assert N.as_int(value) is None and N.as_float(value) is None     # as_int(inf) raised OverflowError


def test_numbers_a_log_prints_still_read():
    assert N.parse_int("4096") == 4096 and N.parse_int(" 1,024 ") == 1024 and N.parse_int("-3") == -3
    assert N.as_int("4096.0") == 4096 and N.as_int(3.7) == 3 and N.as_int("9" * 18) == int("9" * 18)
    assert N.parse_float("0.9") == 0.9 and N.parse_float("1e-05") == 1e-05 and N.as_float("23.65") == 23.65
    assert N.as_typed({"heads": "40", "util": "0.9", "big": BIG, "x": "nan"}) == {
        "heads": 40, "util": 0.9, "big": BIG, "x": "nan"}          # too long / nan: kept as the text


def test_json_in_reads_non_numbers_as_null():
    doc = N.json_loads('{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e999, "e": %s, "f": 5, "g": 0.5}' % BIG)
    assert doc == {"a": None, "b": None, "c": None, "d": None, "e": None, "f": 5, "g": 0.5}
    with pytest.raises(ValueError):
        N.json_loads("[" * 100_000 + "]" * 100_000)                # RecursionError before


# --------------------------------------------------------------------------- log prefixes and captures

PREFIXES = ("rank prefix", "pid prefix", "traceback line number", "vLLM version")


@pytest.mark.parametrize("name, text, rule", [pytest.param(*case, id=case[0]) for case in [
    ("rank prefix", V061.replace("[rank0]:", f"[rank{BIG}]:"), "tp-kv-heads-indivisible"),
    ("pid prefix", V061.replace("pid=6120", "pid=" + "7" * 5000), "tp-kv-heads-indivisible"),
    ("traceback line number", V061.replace("line 476,", f"line {BIG},"), "tp-kv-heads-indivisible"),
    ("vLLM version", V061.replace("version 0.6.1", f"version 0.{BIG}.1"), "tp-kv-heads-indivisible"),
    ("divide capture", V061.replace("8 is not divisible by 5", f"8 is not divisible by {BIG}"), None),
    ("heads capture", RP03.replace("(28)", f"({BIG})"), "tp-heads-indivisible"),
    ("world size capture", WORLD.replace("World size (8)", f"World size ({BIG})"), "parallel-exceeds-gpus"),
    ("KV lines", KV_LINES, "kv-cache-insufficient"),
]])
def test_huge_digit_strings_in_real_lines_cost_the_field_not_the_diagnosis(tmp_path, catalog, name, text, rule):
    d = diagnose(tmp_path, text, catalog)
    assert d.findings, name
    top = d.findings[0]
    if name in PREFIXES:      # a prefix's number is no part of the message: the diagnosis is the same
        assert top.rule == rule and top.fix is not None, (name, top.errors)
    elif top.rule == rule:    # (a catalog that bounds its digit runs may leave the line unrecognized)
        assert top.fix is not None and not top.errors, (name, top.errors)
    assert not any(BIG in (f.fix.summary if f.fix else "") for f in d.findings)


def test_a_huge_rank_or_pid_is_unknown_not_an_error():
    from vllm_doctor.sources.lines import parse_line

    line = parse_line(f"(VllmWorker rank={BIG} pid={BIG}) INFO 09-06 11:20:08 x.py:1] ready")
    assert line.pid is None and line.rank is None and line.message == "ready"
    assert parse_line(f"[rank{BIG}]: AssertionError: 8 is not divisible by 5").message.startswith("AssertionError")


@pytest.mark.parametrize("heads, tp", [(10 ** 11, 3), (10 ** 12, 7), (10 ** 17 + 1, 3), (28, 80_000_000),
                                       (10 ** 17, 10 ** 17 + 1)])
def test_huge_heads_and_tp_in_the_message_answer_at_once(tmp_path, catalog, heads, tp):
    # rp03's line, the head count and the tp size vLLM echoes blown up (`-tp 80000000` typed by hand)
    text = RP03.replace(HEADS_LINE, f"Total number of attention heads ({heads}) must be divisible by tensor "
                                    f"parallel size ({tp})")
    d = diagnose(tmp_path, text, catalog)
    top = d.findings[0]
    assert top.rule == "tp-heads-indivisible" and top.fix is not None, top.errors
    if not pm.real_size(tp):
        assert "not a real" in top.fix.summary
        assert any("is not a real size" in n for n in top.fix.notes), top.fix.notes


def test_tp_80000000_echoed_in_a_divide_error(tmp_path, catalog):
    text = V061.replace("8 is not divisible by 5", "8 is not divisible by 80000000").replace("-tp 5", "-tp 80000000")
    top = diagnose(tmp_path, text, catalog).findings[0]
    assert top.rule == "tp-kv-heads-indivisible"
    assert top.fix.summary.startswith(f"Use --tensor-parallel-size {pm.GUESSED_NODE_GPUS} ")


@pytest.mark.parametrize("edit", [("World size (8)", f"World size ({10 ** 12})"),
                                  ("GPUs (4)", f"GPUs ({10 ** 12})")])
def test_world_size_and_gpus_of_10_12(tmp_path, catalog, edit):
    top = diagnose(tmp_path, WORLD.replace(*edit), catalog).findings[0]
    assert top.rule == "parallel-exceeds-gpus" and top.fix is not None, top.errors


def test_a_snapshot_claiming_10_12_gpus_is_no_gpu_count(tmp_path, catalog):
    snap = _snapshot(tmp_path, {"gpu.count": 10 ** 12})
    top = diagnose(tmp_path, RP03, catalog, snapshot=str(snap)).findings[0]
    assert top.rule == "tp-heads-indivisible" and "--tensor-parallel-size 4" in top.fix.summary
    assert any("GPU count 1000000000000 is not a real size" in n for n in top.fix.notes)


# --------------------------------------------------------------------------- loops bounded by what exists

def test_divisors_by_trial_up_to_the_square_root():
    assert all(pm.divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 2000))
    assert within(pm.divisors, 10 ** 12)[-3:] == [51200, 62500, 64000]      # those up to MAX_CLUSTER_GPUS
    assert within(pm.divisors, 10 ** 18 - 1)[:4] == [1, 3, 7, 9]
    assert pm.divisors(0) == [] and pm.divisors(-40) == []


def test_tp_sizes_of_10_12_heads():
    # padded vocabulary 32000 = 2**8 * 125: the divisors of 10**12 that divide it too
    assert within(pm.valid_tp_sizes, 10 ** 12, vocab=32000, max_tp=10 ** 12) == pm.divisors(32000)
    valid, lines = within(pm.explain_tp_sizes, 10 ** 12, 10 ** 9, 3, vocab=32000)
    assert lines[0].startswith(f"divisors of {10 ** 12} attention heads up to {pm.MAX_CLUSTER_GPUS}: 1, 2, 4, 5")
    assert lines[-1].startswith(f"valid --tensor-parallel-size values up to {pm.MAX_CLUSTER_GPUS}: 1, 2, 4")
    assert len(within(pm.rank_plans, 10 ** 12, 10 ** 12, vocab=32000)) < 100


@pytest.fixture
def huge_model(tmp_path) -> Path:
    """vicuna-13b's config.json with 10**12 attention (and KV) heads."""
    cfg = json.loads((MODELS / "vicuna-13b" / "config.json").read_text())
    cfg.update(num_attention_heads=10 ** 12, num_key_value_heads=10 ** 12)
    model = tmp_path / "huge-heads"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    return model


def _snapshot(tmp_path: Path, facts: dict) -> Path:
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"schema_version": 1, "kind": "vllm-doctor-facts",
                                "facts": {k: {"value": v, "source": "nvml"} for k, v in facts.items()}}))
    return path


@pytest.mark.parametrize("flags, words", [
    (["-tp", "0"], ["--tensor-parallel-size 0 is not a real size", "at least 1"]),
    (["-tp", "-1"], ["--tensor-parallel-size -1 is not a real size"]),
    (["-pp", "0"], ["--pipeline-parallel-size 0 is not a real size"]),
    (["-tp", "100000000"], ["--tensor-parallel-size 100000000 is not a real size", "65536 GPUs"]),
    (["-tp", BIG[:30]], ["more digits than any GPU count"]),
    (["-tp", "300", "-pp", "300"], ["world size"]),
])
def test_check_refuses_sizes_no_machine_has(flags, words):
    rc, out, err = cli("check", "--no-live", "--", "vllm", "serve", str(MODELS / "vicuna-13b"), *flags)
    one_line_error(rc, err, *words)


def test_check_with_10_12_heads_and_a_10_12_gpu_snapshot(tmp_path, huge_model):
    snap = _snapshot(tmp_path, {"gpu.count": 10 ** 12})
    rc, out, err = cli("check", "--no-live", "--facts", str(snap), "--format", "json", "--",
                       "vllm", "serve", str(huge_model), "-tp", "3")
    report = strict_json(out)
    assert rc == 1 and report["findings"][0]["rule"] == "tp-heads-indivisible", err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, words", [
    (["--gpus", "1000000000"], ["--gpus 1000000000 is not a real size"]),
    (["--gpus", BIG[:40]], ["is not a real size"]),
])
def test_plan_refuses_gpu_counts_no_cluster_has(args, words):
    rc, out, err = cli("plan", "--no-live", str(MODELS / "vicuna-13b"), *args)
    one_line_error(rc, err, *words)


def test_plan_on_a_snapshot_claiming_10_12_gpus(tmp_path):
    snap = _snapshot(tmp_path, {"gpu.count": 10 ** 12})
    rc, out, err = cli("plan", "--no-live", "--facts", str(snap), str(MODELS / "vicuna-13b"))
    one_line_error(rc, err, "1000000000000 is not a real size", "--gpus N")


def test_plan_of_a_10_12_head_model(huge_model):
    rc, out, err = cli("plan", "--no-live", str(huge_model), "--gpus", "8", "--gpu-memory", "80", "--format", "json")
    plan = strict_json(out)
    assert rc == 0 and plan["valid_tensor_parallel_sizes"] == [1, 2, 4, 8], err


def test_plan_without_a_layer_count_tries_no_more_stages_than_a_node_has():
    from vllm_doctor.checks.plan import build_plan

    facts = Facts()
    facts.set("model.num_attention_heads", 8, "config.json")      # no num_layers: stages are not capped by it
    result = within(build_plan, facts, "m", pm.MAX_CLUSTER_GPUS, None)
    assert max(lay.pp for lay in result.layouts) == pm.MAX_GPUS_PER_NODE


# --------------------------------------------------------------------------- options

@pytest.mark.parametrize("args, option", [
    (["run", "--kill-after", "nan", "--", "true"], "--kill-after"),
    (["run", "--kill-after", "inf", "--", "true"], "--kill-after"),
    (["run", "--kill-after", "-1", "--", "true"], "--kill-after"),
    (["run", "--settle", "nan", "--", "true"], "--settle"),
    (["--follow", "vllm.log", "--idle-exit", "nan"], "--idle-exit"),
    (["--follow", "vllm.log", "--idle-exit", "1e999"], "--idle-exit"),
    (["--follow", "vllm.log", "--settle", "nan"], "--settle"),
    (["plan", "m", "--gpu-memory", "nan"], "--gpu-memory"),
])
def test_nan_and_inf_are_no_time(args, option):
    rc, out, err = cli(*args)
    assert rc == 2 and "Traceback" not in err and f"argument {option}: " in err, err


def test_seconds_type():
    assert N.seconds("0") == 0.0 and N.seconds("2.5") == 2.5
    for bad in ("nan", "inf", "-1", "1e999", "abc", BIG):
        with pytest.raises(Exception, match="not a number of seconds"):
            N.seconds(bad)


# --------------------------------------------------------------------------- strict JSON out

def test_the_json_report_is_strict():
    # a launch command that sets `nan` and `1e999`: their args.* facts were NaN / Infinity in the report
    path = ROOT / "logs_corpus" / "parallel" / "vicuna13b-tp3.log"
    r = run_cli("--no-live", "--format", "json", "--cmd", "vllm serve m --gpu-memory-utilization nan "
                "--max-model-len 1e999 --swap-space inf", str(path), timeout=CLI_HANG_S)
    report = strict_json(r.stdout.decode())
    assert r.returncode == 1 and report["findings"], r.stderr.decode()


def test_render_json_and_snapshot_write_null_for_non_finite_values():
    from vllm_doctor.findings import Diagnosis
    from vllm_doctor.reports.facts_report import render_snapshot
    from vllm_doctor.reports.json_report import render_json

    facts = Facts()
    for key, value in (("log.kv_cache_gib", float("nan")), ("log.weights_gib", float("inf")),
                       ("env.vars", {"X": [float("-inf")]})):
        facts.set(key, value, "log")
    report = strict_json(render_json(Diagnosis([], facts, [], None, 0, ["x.log"], [])))
    assert report["facts"]["log.kv_cache_gib"]["value"] is None
    assert report["facts"]["env.vars"]["value"] == {"X": [None]}
    snapshot = strict_json(render_snapshot(facts))
    assert snapshot["facts"]["log.weights_gib"]["value"] is None


# --------------------------------------------------------------------------- fact sources that fail

class BrokenNVML:
    """An NVML binding that raises what no NVML raises (a broken install, a bug in a wrapper)."""

    def __getattr__(self, name):
        raise RuntimeError(f"simulated NVML binding bug: {name}")


def test_a_failing_nvml_costs_the_gpu_facts_only():
    facts = Facts()
    notices = gather_facts(facts, live=True, nvml=BrokenNVML(), environ={})
    assert any(n.startswith("GPU facts (NVML) skipped (RuntimeError: simulated") for n in notices), notices


@pytest.mark.parametrize("target", ["vllm_doctor.facts.nvml.collect_gpu_facts",
                                    "vllm_doctor.facts.env.collect_env_facts",
                                    "vllm_doctor.facts.model.load_model_facts"])
def test_a_failing_fact_source_keeps_the_diagnosis(tmp_path, catalog, monkeypatch, target):
    def broken(*args, **kwargs):
        raise TypeError("simulated fact source bug")

    monkeypatch.setattr(target, broken)
    d = diagnose(tmp_path, RP03, catalog, live=True, model=str(MODELS / "qwen2.5-7b"))
    assert d.findings[0].rule == "tp-heads-indivisible" and d.findings[0].fix is not None
    assert any("skipped (TypeError: simulated fact source bug)" in n for n in d.notices), d.notices


BAD_CONFIGS = {
    "malformed JSON": b'{"num_attention_heads": 40,',
    "wrong types": b'{"num_attention_heads": "forty", "num_hidden_layers": {"a": 1}, "hidden_size": [1], '
                   b'"vocab_size": -3, "rope_scaling": {"type": "linear", "factor": "x"}, "quantization_config": 5}',
    "huge numbers": ('{"model_type": "llama", "num_attention_heads": %s, "num_hidden_layers": 1e999, '
                     '"hidden_size": NaN, "max_position_embeddings": Infinity}' % BIG).encode(),
    "non-UTF-8": b'{"num_attention_heads": 40, "name": "\xff\xfe"}',
    "nested too deep": b"[" * 100_000 + b"]" * 100_000,
}


def facts_cmd(capsys, *args):
    """`vllm-doctor facts ARGS` in this process (transformers is imported once, not once per case); an
    exception out of it is the traceback a user would see."""
    from vllm_doctor.cli.main import cmd_facts

    rc = within(cmd_facts, list(args), seconds=60)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize("kind", BAD_CONFIGS)
def test_facts_with_a_bad_config_json(tmp_path, capsys, kind):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(BAD_CONFIGS[kind])
    rc, out, err = facts_cmd(capsys, "--no-color", "--model", str(model))
    assert rc == 0, err[-2000:]
    assert "model.num_attention_heads  forty" not in out and "nan" not in out.lower().split()


BAD_SNAPSHOTS = {
    "malformed JSON": b'{"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {',
    "nested too deep": b'{"schema_version": 1, "kind": "vllm-doctor-facts", "facts": ' + b"[" * 100_000,
    "wrong shapes": json.dumps({"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {
        "gpu.devices": {"value": "zz"}, "env.vars": {"value": 7}, "gpu.visible": {"value": [1]},
        "gpu.p2p": {"value": [[1], 5]}, "gpu.count": {"value": "abc"}}}).encode(),
    "wrong nested shapes": json.dumps({"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {
        "gpu.devices": {"value": [{"index": "x", "memory_total_mib": "lots", "compute_capability": ["a", 1],
                                   "processes": 5, "mig_devices": "none"}, 3]}}}).encode(),
    "huge numbers": ('{"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {"gpu.count": {"value": %s}, '
                     '"gpu.devices": {"value": [{"index": 0, "memory_total_mib": NaN, "memory_free_mib": 1e999}]}}}'
                     % BIG).encode(),
    "non-UTF-8": b'{"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {"x": {"value": "\xff"}}}',
}


@pytest.mark.parametrize("kind", BAD_SNAPSHOTS)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_facts_with_a_bad_snapshot(tmp_path, capsys, kind, fmt):
    snap = tmp_path / "snapshot.json"
    snap.write_bytes(BAD_SNAPSHOTS[kind])
    rc, out, err = facts_cmd(capsys, "--no-color", "--format", fmt, "--facts", str(snap))
    if rc == 2:
        one_line_error(rc, err)
    else:
        assert rc == 0
        if fmt == "json":
            strict_json(out)


def test_facts_cli_with_a_snapshot_nested_too_deep(tmp_path):
    snap = tmp_path / "snapshot.json"
    snap.write_bytes(BAD_SNAPSHOTS["nested too deep"])
    rc, out, err = cli("facts", "--facts", str(snap))
    one_line_error(rc, err, "invalid JSON")


def test_a_snapshot_of_the_wrong_shape_is_said_and_left_out(tmp_path):
    snap = tmp_path / "snapshot.json"
    snap.write_bytes(BAD_SNAPSHOTS["wrong shapes"])
    facts = Facts()
    notices = gather_facts(facts, live=False, snapshot=str(snap))
    assert notices == [f"{snap}: facts of the wrong shape left out: env.vars, gpu.devices, gpu.p2p, gpu.visible"]
    assert facts.get("gpu.devices") is None and facts.get("gpu.count") == "abc"
