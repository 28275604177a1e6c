"""One diagnosis per run: two launches in one file, two files of two launches, a rotated or truncated
followed log, a second launch in a pipe. Built from real logs of logs_corpus/: each run must be diagnosed
exactly as its log is on its own, and no run's command may carry another run's fix."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import ROOT
from test_follow import follow, stop
from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.diagnosis.runs import MAX_RUNS, RunSplitter, args_differ, start_of
from vllm_doctor.diagnosis.saved import Options, diagnose_paths, scan_file
from vllm_doctor.facts import Facts
from vllm_doctor.sources.lines import parse_line
from vllm_doctor.sources.tail import Tail
from vllm_doctor.streams.follow import follow as follow_loop

CORPUS = ROOT / "logs_corpus"
# vLLM 0.32: `$ vllm serve … --tensor-parallel-size 3`, the logo banner, non-default args; 40 heads
TP = CORPUS / "parallel" / "vicuna13b-tp3.log"
# vLLM 0.6.4: `$ vllm serve …`, the API server banner, args: Namespace(…); bf16 on a T4
BF16 = CORPUS / "platform" / "p11-bf16-t4.log"
# `docker logs` of vLLM 0.10: no shell line, the platform line, the banner, non-default args; a 401
HUB = CORPUS / "real" / "config" / "rc12-opea-docker-cpu-401-llama3.log"
LINES = {path: len(path.read_text().splitlines()) for path in (TP, BF16, HUB)}


def _diagnose(*paths, **options):
    from vllm_doctor.rules.catalog import cached_catalog

    return diagnose_paths([str(p) for p in paths], cached_catalog(None), Options(live=False, **options))


def _shape(d) -> tuple:
    """What a run's diagnosis says: its cause, the fixed command, its own command, version and platform."""
    top = d.findings[0] if d.findings else None
    return (top and top.rule, top and top.fix_command, d.command.render() if d.command else None,
            d.facts.get("vllm.version"), d.facts.get("log.platform"))


ALONE = {}


def _alone(path: Path) -> tuple:
    if path not in ALONE:
        d = _diagnose(path)
        assert d.earlier == [] and d.run_label == "", "a log of one launch is one run"
        ALONE[path] = _shape(d)
    return ALONE[path]


def _concat(tmp_path: Path, *paths: Path) -> Path:
    out = tmp_path / "two-launches.log"
    out.write_text("".join(p.read_text() for p in paths))
    return out


def _ranges(*paths: Path) -> list[tuple[int, int]]:
    out, first = [], 1
    for path in paths:
        out.append((first, first + LINES[path] - 1))
        first += LINES[path]
    return out


def _assert_runs(d, paths, labels, spans) -> None:
    """Each run diagnosed as its log alone, on its own lines (`spans`: first and last line numbers); no
    run's fix is another run's command."""
    runs = [*d.earlier, d]
    assert [r.run_label for r in runs] == labels
    assert [_shape(r) for r in runs] == [_alone(p) for p in paths]
    for run, (lo, hi) in zip(runs, spans, strict=True):
        assert run.lines == hi - lo + 1
        assert all(lo <= line.lineno <= hi for f in run.findings for line in f.evidence)
    first, last = runs[0], runs[-1]
    if first.command.render() != last.command.render():
        assert first.command.render() not in (last.findings[0].fix_command or "")
        assert last.command.render() not in (first.findings[0].fix_command or "")


# The platform line of rc12 comes before its banner: it is the second run's, not the first's.
ORDERS = [(TP, BF16), (BF16, TP), (BF16, HUB), (HUB, TP)]


@pytest.mark.parametrize("paths", ORDERS, ids=lambda ps: "+".join(p.stem.split("-")[0] for p in ps))
def test_two_launches_in_one_file_are_diagnosed_apart(tmp_path, paths):
    log = _concat(tmp_path, *paths)
    d = _diagnose(log)
    assert d.findings[0].rule == _alone(paths[-1])[0]          # the last run's cause comes first
    spans = _ranges(*paths)
    if paths[-1] == HUB:      # its first line (`docker logs vllm-service`) is no vLLM output: the run before's
        spans[0], spans[1] = (spans[0][0], spans[0][1] + 1), (spans[1][0] + 1, spans[1][1])
    _assert_runs(d, paths, [f"{log}:{a}-{b}" for a, b in spans], spans)


def test_two_files_of_two_launches_are_two_runs():
    d = _diagnose(TP, BF16)
    _assert_runs(d, [TP, BF16], [str(TP), str(BF16)], [(1, LINES[TP]), (1, LINES[BF16])])
    assert d.earlier[0].sources == [str(TP)] and d.sources == [str(BF16)]


def test_split_logs_of_one_launch_stay_one_run(tmp_path):
    """A server's log in two pieces, and a second file repeating the same launch's start: one run."""
    lines = TP.read_text().splitlines(True)
    head, tail = tmp_path / "server.log.1", tmp_path / "server.log"
    head.write_text("".join(lines[:10]))
    tail.write_text("".join(lines[10:]))
    d = _diagnose(head, tail)
    assert d.earlier == [] and d.run_label == ""
    assert _shape(d) == _alone(TP) and d.lines == LINES[TP]
    again = tmp_path / "again.log"
    again.write_text("".join(lines))
    d = _diagnose(head, again)
    assert d.earlier == [] and _shape(d)[:3] == _alone(TP)[:3]


def test_a_banner_printed_twice_by_one_launch_is_one_run(tmp_path):
    lines = HUB.read_text().splitlines(True)
    banner = next(i for i, line in enumerate(lines) if "vLLM API server version" in line)
    args = next(i for i, line in enumerate(lines) if "non-default args" in line)
    repeated = tmp_path / "repeated.log"
    repeated.write_text("".join(lines[:args + 1] + [lines[banner], lines[args]] + lines[args + 1:]))
    d = _diagnose(repeated)
    assert d.earlier == [] and _shape(d) == _alone(HUB)


def test_a_relaunch_after_its_failure_is_a_new_run(tmp_path):
    log = _concat(tmp_path, BF16, BF16)
    d = _diagnose(log)
    spans = _ranges(BF16, BF16)
    _assert_runs(d, [BF16, BF16], [f"{log}:{a}-{b}" for a, b in spans], spans)


def test_a_crash_loop_keeps_the_last_runs(tmp_path):
    log = tmp_path / "crash-loop.log"
    log.write_text(BF16.read_text() * (MAX_RUNS + 3))
    d = _diagnose(log)
    assert len(d.earlier) == MAX_RUNS - 1
    assert _shape(d) == _alone(BF16)
    first = 3 * LINES[BF16] + 1
    assert d.earlier[0].run_label == f"{log}:{first}-{first + LINES[BF16] - 1}"
    assert any(f"3 earlier runs ({3 * LINES[BF16]} lines) not diagnosed" in n for n in d.notices)


def test_cmd_is_the_last_runs_command(tmp_path):
    log = _concat(tmp_path, TP, BF16)
    given = "vllm serve Qwen/Qwen2.5-3B-Instruct --max-model-len 4096"
    d = _diagnose(log, command=given)
    assert d.facts.get("launch.command") == given and d.facts.source("launch.command") == "user"
    earlier = d.earlier[0]
    assert _shape(earlier)[:3] == _alone(TP)[:3]
    assert earlier.facts.get("launch.command") == TP.read_text().splitlines()[0][2:]
    assert earlier.facts.source("launch.command") == "log"


def test_the_args_of_another_process_are_the_same_launch():
    """Namespace dumps carry object addresses (`<function serve at 0x…>`) that differ in every process."""
    log = CORPUS / "config" / "c32-tcpstore-v066-ephemeral-race.log"
    line = next(ln for ln in log.read_text().splitlines() if "args: Namespace(" in ln and " at 0x" in ln)
    mine = start_of(parse_line(line))
    theirs = start_of(parse_line(line.replace(" at 0x", " at 0x1234")))
    assert mine.kind == "args" and mine.args and not args_differ(mine.args, theirs.args)
    other = start_of(parse_line(line.replace("port=", "port=1", 1)))
    assert args_differ(mine.args, other.args)


def _corpus_logs() -> list[Path]:
    marks = (b"version ", b"args: ", b"$ ")
    return [p for p in sorted(CORPUS.rglob("*.log")) if any(m in p.read_bytes() for m in marks)]


def test_every_corpus_log_is_one_run(catalog):
    split = []
    for path in _corpus_logs():
        runs = RunSplitter(lambda: Diagnoser(catalog, Facts()))
        scan_file(str(path), runs)
        if len(runs.runs) != 1:
            split.append((path.relative_to(ROOT).as_posix(), [r.label() for r in runs.runs]))
    assert not split


# ---- live sessions -----------------------------------------------------------------------------------
class Notes:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def style(self, text: str, code: str) -> str:
        return text

    @property
    def text(self) -> str:
        return "".join(self.parts)


class NoTrap:
    fd = -1

    def take(self) -> bool:
        return False


def _session(catalog, source: str, notes: Notes) -> LiveSession:
    return LiveSession(catalog, Options(live=False), notes, source=source, settle=0.05)


def test_a_second_launch_in_a_pipe_is_a_run_of_its_own(catalog):
    notes = Notes()
    session = _session(catalog, "<stdin>", notes)
    data = TP.read_bytes() + BF16.read_bytes()
    for i in range(0, len(data), 512):          # a pipe's reads
        session.feed(data[i:i + 512])
        session.poll()
    d = session.finish()
    assert [r.run_label for r in (*d.earlier, d)] == [f"<stdin>:{a}-{b}" for a, b in _ranges(TP, BF16)]
    assert [_shape(r)[:3] for r in (*d.earlier, d)] == [_alone(p)[:3] for p in (TP, BF16)]
    assert f"a new launch starts at <stdin>:{LINES[TP] + 1}" in notes.text
    # each early report carries its own run's fix
    runs = [line for line in notes.text.splitlines() if line.strip().startswith("vllm-doctor:   run: ")]
    assert [r.split("run: ", 1)[1] for r in runs] == [_alone(TP)[1], _alone(BF16)[1]]
    assert [e.run_label for e in session.so_far().earlier] == [f"<stdin>:1-{LINES[TP]}"]


def test_one_launch_in_a_pipe_is_one_run(catalog):
    session = _session(catalog, "<stdin>", Notes())
    session.feed(TP.read_bytes())
    d = session.finish()
    assert d.earlier == [] and d.run_label == "" and _shape(d)[:3] == _alone(TP)[:3]


@pytest.mark.parametrize("how", ["rotation", "truncation"])
def test_follow_a_rotated_or_truncated_log_starts_a_new_run(tmp_path, catalog, how):
    log = tmp_path / "server.log"
    log.write_bytes(TP.read_bytes())
    notes = Notes()
    session = _session(catalog, str(log), notes)
    tail = Tail(str(log))
    rounds = []

    def tick() -> None:
        rounds.append(1)
        if len(rounds) == 2:            # the first file was read: the server is restarted
            if how == "rotation":
                os.rename(log, tmp_path / "server.log.1")
            log.write_bytes(BF16.read_bytes())      # shorter than the first: truncated

    try:
        follow_loop(tail, session, NoTrap(), idle_exit=0.3, poll_s=0.02, tick=tick)
    finally:
        tail.close()
    d = session.finish()
    assert f"was {'rotated' if how == 'rotation' else 'truncated'}" in notes.text
    assert [r.run_label for r in (*d.earlier, d)] == [f"{log} (before {how})", str(log)]
    assert [_shape(r)[:3] for r in (*d.earlier, d)] == [_alone(p)[:3] for p in (TP, BF16)]
    assert [r.lines for r in (*d.earlier, d)] == [LINES[TP], LINES[BF16]]


def _wait(done, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while not done() and time.monotonic() < end:
        time.sleep(0.02)
    return done()


def test_follow_cli_reports_the_new_file_first(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(TP.read_bytes())
    proc, out, err = follow(log, "--format", "json")
    try:
        assert err.wait_for("failure at", timeout=15), err.text()
        os.rename(log, tmp_path / "server.log.1")
        log.write_text(BF16.read_text())
        assert err.wait_for("was rotated", timeout=15), err.text()
        assert _wait(lambda: err.text().count("failure at") == 2), err.text()
    finally:
        rc = stop(proc)
    out.join()
    assert rc == 1
    report = json.loads(out.text())
    assert [f["rule"] for f in report["findings"]][:1] == [_alone(BF16)[0]]
    assert report["findings"][0]["fix"]["command"] == _alone(BF16)[1]
    earlier = report["earlier_runs"]
    assert [e["findings"][0]["rule"] for e in earlier] == [_alone(TP)[0]]
    assert earlier[0]["findings"][0]["fix"]["command"] == _alone(TP)[1]
