"""A flood of one message (NCCL warning a worker retries, a crash loop) in bounded memory and linear time,
with the same diagnosis as the message printed a few times.

The floods are written by us as variants of the real log logs_corpus/real/nccl/rn03-llmd-dp16-shm-enospc.log
(llm-d, DP16, /dev/shm full): its NCCL WARN line repeated with new timestamps, sizes and worker threads,
as a retrying worker prints it; the crash loop is a real failing start-up log written again and again.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from conftest import ROOT
from test_runs import Notes
from vllm_doctor.diagnosis import evidence, live
from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.diagnosis.repeats import RepeatCache
from vllm_doctor.diagnosis.runs import MAX_RUNS, RunSplitter
from vllm_doctor.diagnosis.saved import Options, diagnose_paths, new_diagnoser, scan_file
from vllm_doctor.sources.scan import number_key

REAL = ROOT / "logs_corpus" / "real" / "nccl" / "rn03-llmd-dp16-shm-enospc.log"
CRASH = ROOT / "logs_corpus" / "parallel" / "vicuna13b-tp3.log"


def _flood(tmp_path: Path, copies: int, hosts: int = 1, stamp: bool = True) -> Path:
    lines = REAL.read_text().splitlines(keepends=True)
    warn = lines[0] if stamp else lines[0].split("] ", 1)[1]     # as the log's other NCCL lines print
    assert "NCCL WARN Error while creating shared memory segment" in warn
    out = []
    for i in range(copies):
        host = f"vllm-deepseek-ep-decode-{i % hosts}"
        out.append(warn.replace("09:06:25", f"09:{6 + i // 3600 % 50:02d}:{i // 60 % 60:02d}")
                       .replace("33030528", str(33030528 + 4096 * (i % 97)))
                       .replace("vllm-deepseek-ep-decode-0:3663:4044", f"{host}:3663:{4044 + i % 4}"))
    path = tmp_path / "flood.log"
    path.write_text("".join(out) + "".join(lines[1:]))
    return path


def _shape(diagnosis) -> list[tuple]:
    return [(f.rule, f.fix.summary if f.fix else None, f.rewrite.command if f.rewrite else None)
            for f in diagnosis.findings]


def test_a_flood_is_diagnosed_as_the_message_printed_once_and_counted(tmp_path):
    once = diagnose_paths([str(REAL)], _catalog(), Options(live=False))
    path = _flood(tmp_path, 30_000)
    flood = diagnose_paths([str(path)], _catalog(), Options(live=False))
    assert _shape(flood) == _shape(once)
    top = flood.findings[0]
    assert top.rule == "nccl-shm"
    # every copy is counted, even though only a sample is kept
    assert top.more_like_it == 30_000 - len(top.evidence)
    assert flood.lines == 30_000 + len(REAL.read_text().splitlines()) - 1


def test_kept_matches_stay_bounded_and_the_last_copy_is_among_them(tmp_path):
    path = _flood(tmp_path, 20_000)
    runs = RunSplitter(lambda: new_diagnoser(_catalog(), Options(live=False)))
    scan_file(str(path), runs)
    store = runs.diagnoser.store
    kept = list(store)
    patterns = {(m.pattern.rule_id, m.pattern.name) for m in kept}
    assert len(store) >= 20_000
    assert len(kept) <= len(patterns) * (evidence.FIRST + evidence.LAST + evidence.ORIGINS)
    warn = [m for m in kept if "creating shared memory segment" in m.line.message]
    assert max(m.line.lineno for m in warn) == 20_000            # the last copy, parsed at the end
    assert warn[-1].captures["shm_size"] == str(33030528 + 4096 * (19_999 % 97))   # its own numbers


def test_repeats_from_other_hosts_are_not_folded_into_one(tmp_path):
    """A copy whose NCCL host prefix differs is a line of its own (the prefix is kept verbatim in the key):
    every host the warning came from is still known."""
    path = _flood(tmp_path, 4_000, hosts=7, stamp=False)
    runs = RunSplitter(lambda: new_diagnoser(_catalog(), Options(live=False)))
    scan_file(str(path), runs)
    runs.diagnoser.logfacts.publish_hosts()
    hosts = runs.diagnoser.facts.get("log.hostnames") or []
    assert {f"vllm-deepseek-ep-decode-{k}" for k in range(7)} <= set(hosts)


def test_number_key_keeps_the_prefix_and_zeroes_the_rest():
    a = b"(RayWorkerWrapper pid=3223, ip=10.195.122.131) ERROR 05-02 00:18:05 worker_base.py:145] Error 12"
    b = b"(RayWorkerWrapper pid=3223, ip=10.195.122.132) ERROR 05-02 00:19:59 worker_base.py:145] Error 98"
    c = b"(RayWorkerWrapper pid=3223, ip=10.195.122.131) ERROR 05-02 00:19:59 worker_base.py:145] Error 98"
    assert number_key(a) != number_key(b)          # another node
    assert number_key(a) == number_key(c)          # the same process, other numbers
    nccl = b"node-3:12:40 [3] misc/shmutils.cc:129 NCCL WARN Error while creating shared memory segment (size 1)"
    assert number_key(nccl).startswith(b"node-3:12:40 [3] misc/shmutils.cc:129 NCCL WARN")
    assert number_key(nccl).endswith(b"(size 0)")


@pytest.mark.parametrize("path", sorted((ROOT / "logs_corpus").rglob("*.log"))[::4],
                         ids=lambda p: p.stem.split("-")[0])
def test_known_lines_change_no_diagnosis(path, monkeypatch):
    """Skipping the copies of known lines is only a shortcut: every corpus log (one in four here) is
    diagnosed the same with it and without it."""
    with_cache = diagnose_paths([str(path)], _catalog(), Options(live=False))
    monkeypatch.setattr(RepeatCache, "learn", lambda self, key, line, new: None)
    without = diagnose_paths([str(path)], _catalog(), Options(live=False))
    assert _shape(with_cache) == _shape(without)
    assert [[ln.lineno for ln in f.evidence] for f in with_cache.findings] == \
        [[ln.lineno for ln in f.evidence] for f in without.findings]
    assert with_cache.lines == without.lines


def test_a_crash_loop_keeps_the_last_runs_and_lets_the_others_go(tmp_path):
    text = CRASH.read_text()
    path = tmp_path / "loop.log"
    path.write_text(text * (MAX_RUNS + 9))
    runs = RunSplitter(lambda: new_diagnoser(_catalog(), Options(live=False)))
    scan_file(str(path), runs)
    assert len(runs.runs) == MAX_RUNS and runs.dropped == 9
    diagnosis = diagnose_paths([str(path)], _catalog(), Options(live=False))
    assert diagnosis.findings[0].rule == "tp-heads-indivisible"
    assert len(diagnosis.earlier) == MAX_RUNS - 1


def test_live_reporting_of_a_flood_is_linear(tmp_path, monkeypatch):
    """The pipe reports the failure once; later copies of an already reported rule cost no re-walk of the
    earlier matches (that made a flood quadratic: every poll copied every earlier match)."""
    data = _flood(tmp_path, 12_000).read_bytes()
    copies = []
    real_copy = copy.copy
    monkeypatch.setattr(live.copy, "copy", lambda obj: copies.append(1) or real_copy(obj))
    session = live.LiveSession(_catalog(), Options(live=False), Notes(), source="<stdin>", settle=0.0)
    for pos in range(0, len(data), 2048):          # small reads, each followed by a poll, as in the pipe
        session.feed(data[pos:pos + 2048])
        session.poll()
    diagnosis = session.finish()
    assert [f.rule for f in session.reported] == ["nccl-shm"]
    assert diagnosis.findings[0].rule == "nccl-shm"
    assert len(copies) < 200


def test_a_diagnoser_per_launch_shares_the_catalog_index():
    a, b = Diagnoser(_catalog()), Diagnoser(_catalog())
    assert a.index is b.index and a.index.fact_ac is b.index.fact_ac


_CATALOG = None


def _catalog():
    global _CATALOG
    if _CATALOG is None:
        from vllm_doctor.rules.catalog import load_catalog

        _CATALOG = load_catalog(ROOT / "rules")
    return _CATALOG


def test_a_traceback_in_the_middle_of_a_flood_is_read_whole(tmp_path):
    """Blocks of a flood are read line by line (sources/scan._scan_flood): a line no copy explains, and
    the traceback it opens, must still reach the diagnosis with their own line numbers."""
    flood = _flood(tmp_path, 60_000).read_text().splitlines(keepends=True)
    failure = CRASH.read_text().splitlines(keepends=True)[11:]       # from `Traceback (most recent ...`
    path = tmp_path / "mixed.log"
    path.write_text("".join(flood[:40_000] + failure + flood[40_000:]))
    diagnosis = diagnose_paths([str(path)], _catalog(), Options(live=False))
    found = {f.rule: f for f in diagnosis.findings}
    assert "tp-heads-indivisible" in found
    heads = found["tp-heads-indivisible"]
    assert any(ln.lineno == 40_000 + 24 and "attention heads (40)" in ln.raw for ln in heads.evidence)
    assert diagnosis.lines == len(flood) + len(failure)


def test_the_report_counts_the_flood(tmp_path):
    import json

    from conftest import run_cli

    path = _flood(tmp_path, 25_000)
    text = run_cli("--no-live", str(path))
    out = text.stdout.decode()
    assert text.returncode == 1
    # the evidence lines shown (cut to the width around what the rule matched)
    shown = sum(ln.startswith("  | ") and " more like " not in ln for ln in out.splitlines())
    assert shown == 2
    assert f"… and {25_000 - shown:,} more like " in out
    report = json.loads(run_cli("--no-live", "--format", "json", str(path)).stdout)
    top = report["findings"][0]
    assert top["rule"] == "nccl-shm" and top["more_like_it"] + len(top["evidence"]) == 25_000
