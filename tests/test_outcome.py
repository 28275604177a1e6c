"""How a run ended (diagnosis/outcome.py) and the traceback chains it reads."""
from __future__ import annotations

import pytest

from vllm_doctor.diagnosis.outcome import Outcome, decide, interrupted_at
from vllm_doctor.events.tracebacks import TracebackAssembler
from vllm_doctor.sources.lines import parse_line

# Python's own shape of an interrupted import (a real vLLM 0.32 start-up, Ctrl-C 3 s in, shortened)
INTERRUPTED = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.11/importlib/metadata/__init__.py", line 565, in read_text
    return self._path.joinpath(filename).read_text(encoding='utf-8')
FileNotFoundError: [Errno 2] No such file or directory: 'entry_points.txt'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/opt/venv/bin/vllm", line 5, in <module>
    from vllm.entrypoints.cli.main import main
KeyboardInterrupt
"""


def _tracebacks(text: str):
    assembler = TracebackAssembler()
    for n, raw in enumerate(text.splitlines(), 1):
        assembler.feed(parse_line(raw, "x.log", n))
    assembler.close()
    return assembler.finished


def test_a_chain_header_after_the_blank_line_links_the_two_tracebacks():
    first, second = _tracebacks(INTERRUPTED)
    assert (first.exc_type, second.exc_type) == ("FileNotFoundError", "KeyboardInterrupt")
    assert second.cause is first


def test_a_blank_line_without_a_chain_header_links_nothing():
    text = INTERRUPTED.replace("During handling of the above exception, another exception occurred:",
                               "INFO 12-06 10:00:00 [api_server.py:1] something else")
    first, second = _tracebacks(text)
    assert second.cause is None


def test_an_interrupt_counts_from_the_first_traceback_of_its_chain():
    first, second = _tracebacks(INTERRUPTED)
    first.start_seq, first.end_seq, second.start_seq, second.end_seq = 1, 4, 8, 11
    assert interrupted_at([first, second]) == [1]


def test_after_a_served_run_only_the_stop_s_own_exceptions_come_before_its_line():
    outcome = decide({"server_ready": 10, "serving": 20}, [50, 5])
    assert outcome == Outcome(served=10, stopped=50, progress=20) and outcome.label == "served, then stopped"
    assert outcome.is_shutdown(60)                                      # anything after the stop
    assert outcome.is_shutdown(40, "vllm.v1.engine.exceptions.EngineDeadError")   # the race before its line
    assert not outcome.is_shutdown(40, "RuntimeError")                  # a crash the user then stopped
    assert not outcome.is_shutdown(9, "KeyboardInterrupt")              # before the server served


def test_a_run_stopped_during_start_up_and_one_never_stopped():
    assert decide({}, [30]).label == "stopped during start-up"
    assert decide({}, [30]).is_shutdown(30, "RuntimeError") and not decide({}, [30]).is_shutdown(29, "KeyboardInterrupt")
    never = decide({"serving": 3}, [])
    assert never.label == "served" and not never.is_shutdown(99, "EngineDeadError")


def _milestones(lines: list[str]) -> dict[str, int]:
    from vllm_doctor.events.logfacts import LogFacts
    from vllm_doctor.facts import Facts

    facts = LogFacts(Facts())
    for seq, raw in enumerate(lines, 1):
        line = parse_line(raw, "x.log", seq)
        facts.feed(line.raw, line.message, line.ip, seq)
    return facts.first_seen


def test_a_request_the_http_server_answered_says_the_start_up_was_over():
    # uvicorn's access log, as vLLM 0.32's API server prints it (a real CPU run) and vllm-omni's 0.19 (th11)
    assert _milestones(['INFO:     127.0.0.1:41542 - "POST /v1/completions HTTP/1.1" 200 OK']) == {"http_served": 1}
    assert _milestones(['(APIServer pid=81599) INFO:     127.0.0.1:56038 - "GET /v1/videos/video_gen_de25 '
                        'HTTP/1.1" 200 OK',
                        'INFO:     10.0.0.7:5123 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request']) \
        == {"http_served": 1}
    assert decide({"http_served": 7}, []).served == 7
    # a client's request line (urllib3's debug log of a hub download) says nothing of this server
    assert _milestones(['DEBUG:urllib3.connectionpool:https://huggingface.co:443 "GET /api/models/Qwen/Qwen3-8B/'
                        'revision/main HTTP/1.1" 200 3216']) == {}


def test_a_process_closing_its_messaging_is_an_exit_not_a_failure(tmp_path):
    """pyzmq's ContextTerminated (an offline LLM's exit, PR #13565: real/healthy/th01) alone is no finding;
    with an ERROR line that says more, the run failed and stays a finding."""
    from conftest import ROOT
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    log = ROOT / "logs_corpus/real/healthy/th01-v1-llm-exit-zmq-context-terminated.log"
    d = diagnose_paths([str(log)], cached_catalog(None), Options(live=False))
    assert not d.findings and any("closing its messaging" in n for n in d.notices)
    died = tmp_path / "th01-died.log"
    died.write_text(log.read_text() + "ERROR 02-19 10:00:00 [core_client.py:300] Engine core proc EngineCore_0 "
                    "died unexpectedly, shutting down client.\n")
    d = diagnose_paths([str(died)], cached_catalog(None), Options(live=False))
    assert [f.rule for f in d.findings] == ["unrecognized"]


def _word(i: int) -> str:
    """A different word per line (digits would be masked: lines alike but for numbers count as repeats)."""
    return "".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(6))


def test_an_error_line_long_before_the_exit_still_counts(tmp_path):
    """The ERROR line may be far from the exit's traceback: 50 error-looking lines between them change nothing."""
    from conftest import ROOT
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    log = ROOT / "logs_corpus/real/healthy/th01-v1-llm-exit-zmq-context-terminated.log"
    died = tmp_path / "died-early.log"
    died.write_text("ERROR 02-19 10:00:00 [core_client.py:300] Engine core proc EngineCore_0 died unexpectedly, "
                    "shutting down client.\n" + "".join(f"WARNING 02-19 10:00:01 [x.py:1] {_word(i)} error: retried\n"
                                                          for i in range(50))
                    + log.read_text())
    d = diagnose_paths([str(died)], cached_catalog(None), Options(live=False))
    assert [f.rule for f in d.findings] == ["unrecognized"]


def _rules(path) -> list[str]:
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    return [f.rule for f in diagnose_paths([str(path)], cached_catalog(None), Options(live=False)).findings]


def test_a_fatal_cpp_check_is_a_failure_and_its_info_lines_are_not(tmp_path):
    """Ray's C++ logs (`[2025-12-12 15:10:48,697 C 42791 42791]`, spdlog): a `C` line is a failed RAY_CHECK
    that aborts the raylet (real/multinode rmn01, rmn04: "no problem found" before); its I/W/E lines in a
    healthy run are no finding (real/healthy/th01 with Ray's INFO/WARNING lines added)."""
    from conftest import ROOT

    for case in ("rmn01-ray-cgraph-raylet-checkfail-worker-node", "rmn04-ray-cgraph-raylet-checkfail-driver-node"):
        assert _rules(ROOT / f"logs_corpus/real/multinode/{case}.log") == ["unrecognized"], case
    line = parse_line("(EngineCore_DP0 pid=3) (raylet, ip=10.0.0.2) [2025-12-12 15:10:48,697 C 42791 42791] (raylet) "
                      "x.cc:153: Check failed")
    # the pid before the daemon prefix is the forwarding process's; the header's is the raylet's own
    assert (line.level, line.ip, line.proc, line.pid) == ("CRITICAL", "10.0.0.2", "raylet", 42791)
    healthy = ROOT / "logs_corpus/real032/healthy/h01-qwen25-05b-tp1-serve-sigint.log"
    if not healthy.exists():
        healthy = ROOT / "logs_corpus/real/healthy/th01-v1-llm-exit-zmq-context-terminated.log"
    noisy = tmp_path / "ray-noise.log"
    noisy.write_text("(raylet) [2025-12-12 15:10:40,001 I 42791 42791] (raylet) main.cc:200: Setting cluster ID\n"
                     "(raylet) [2025-12-12 15:10:40,002 W 42791 42791] (raylet) memory_monitor.cc:100: low memory\n"
                     + healthy.read_text())
    assert _rules(noisy) == _rules(healthy)


def test_a_worker_that_died_under_a_serving_engine_is_a_failure(tmp_path):
    """real/multinode/rmn03: the paste starts at `Worker proc VllmWorker-1 died unexpectedly` and shows the
    serving only in the API server's stats after it (46 requests running): a failure, not an all-clear.
    With a stop signal in the log, the same line is the shutdown's (PR #28898's race)."""
    from conftest import ROOT

    log = ROOT / "logs_corpus/real/multinode/rmn03-mp-tp8-worker1-died.log"
    assert _rules(log) == ["unrecognized"]
    stopped = tmp_path / "stopped.log"
    stopped.write_text(log.read_text() + "(APIServer pid=1) INFO 08-25 12:24:25 [launcher.py:80] Shutting down "
                       "FastAPI HTTP server.\n")
    assert _rules(stopped) == []


def test_an_uncaught_cpp_exception_aborts_its_process_unless_a_stop_came_first(tmp_path):
    """libstdc++'s `terminate called after throwing an instance of 'X'` is a process aborting (SIGABRT): a failure
    by itself, never an all-clear; after the stop of a healthy run (real/healthy hv032-tp2-sigint) it is part of
    the shutdown."""
    from conftest import ROOT
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    abort = "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"
    alone = tmp_path / "abort.log"
    alone.write_text("INFO 12-06 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n" + abort)
    d = diagnose_paths([str(alone)], cached_catalog(None), Options(live=False))
    assert [f.rule for f in d.findings] == ["unrecognized"] and "std::bad_alloc" in d.findings[0].explanation
    healthy = ROOT / "logs_corpus/real/healthy/v032cpu-tp2-healthy-sigint.log"
    stopped = tmp_path / "stopped.log"
    stopped.write_text(healthy.read_text() + abort)
    d = diagnose_paths([str(stopped)], cached_catalog(None), Options(live=False))
    assert not d.findings, [f.rule for f in d.findings]


def test_an_error_where_start_up_ends_is_no_all_clear_and_one_it_went_past_is_nothing(tmp_path):
    """A start-up whose last words are an ERROR line no rule reads (a paste of the error alone) is an
    unrecognized failure, not "no problem found"; the same line followed by a new start-up phase (vLLM went on)
    is nothing, and so is a death notice that ends a healthy offline run (real/healthy/th03)."""
    from conftest import ROOT

    head = ("INFO 12-01 00:00:00 [api_server.py:1] vLLM API server version 0.10.0\n"
            "INFO 12-01 00:00:01 [config.py:1] Using max model len 4096\n")
    error = "ERROR 12-01 00:00:05 [core.py:1] EngineCore failed to start.\n"
    log = tmp_path / "lone.log"
    log.write_text(head + error)
    assert _rules(log) == ["unrecognized"]
    log.write_text(head + error.replace("EngineCore failed to start.", "Could not read the chat template; using "
                                        "the default") + "INFO 12-01 00:00:09 [gpu_model_runner.py:1] Loading "
                   "weights took 1.20 seconds\nINFO 12-01 00:00:10 [loader.py:1] Model loading took 0.93 GiB\n")
    assert _rules(log) == []
    assert _rules(ROOT / "logs_corpus/real/healthy/th03-v011-offline-exit-enginecore-died-mineru.log") == []


def test_rays_oom_killer_is_a_failure_on_its_node_unless_a_stop_came_first(tmp_path):
    """Ray's memory monitor reports the workers it killed for host memory in one aggregated line (no error level,
    no exception): `N worker(s) were killed due to the node running low on memory. Memory on the node (IP: …)`.
    Alone it is a failure on the node it names, never an all-clear; after the stop of a healthy run it is part
    of the shutdown."""
    from conftest import ROOT
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    killed = ("(raylet) 1 worker(s) were killed due to the node running low on memory. Memory on the node "
              "(IP: 10.0.0.5, ID: 6b0f1d2e3c4a5b69788f7e6d5c4b3a29) was 240.12GB / 251.50GB (0.954733), which "
              "exceeds the memory usage threshold of 0.95.\n")
    alone = tmp_path / "killed.log"
    alone.write_text("INFO 12-06 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n" + killed)
    d = diagnose_paths([str(alone)], cached_catalog(None), Options(live=False))
    assert [f.rule for f in d.findings] == ["unrecognized"] and "running low on memory" in d.findings[0].explanation
    assert d.findings[0].facts.get("failed_first_on") == "10.0.0.5"
    healthy = ROOT / "logs_corpus/real/healthy/v032cpu-tp2-healthy-sigint.log"
    stopped = tmp_path / "stopped.log"
    stopped.write_text(healthy.read_text() + killed)
    d = diagnose_paths([str(stopped)], cached_catalog(None), Options(live=False))
    assert not d.findings, [f.rule for f in d.findings]


def test_a_request_the_handler_answered_with_an_error_is_no_failure_of_the_server():
    """vLLM's request handlers log what they answer with an error response (a prompt over --max-model-len: a
    ValueError, 400) and the server goes on; the same handler reporting the engine's death (EngineDeadError), or
    an ERROR line of the engine's own code, is a failure."""
    from vllm_doctor.events.requests import request_error

    def line(text: str):
        return parse_line(text, "x.log", 1)

    over = ("(APIServer pid=7) ERROR 10-07 10:45:15 [serving_chat.py:263] ValueError: This model's maximum context "
            "length is 40960 tokens. However, your request has 91714 input tokens.")
    assert request_error(line(over))
    assert request_error(line("(APIServer pid=7) ERROR 12-06 19:45:47 [serving.py:500] Error in completion stream "
                              "generator."))
    assert not request_error(line("(APIServer pid=7) ERROR 12-06 19:45:47 [serving.py:500] vllm.v1.engine.exceptions"
                                  ".EngineDeadError: EngineCore encountered an issue."))
    assert not request_error(line("(APIServer pid=7) ERROR 12-06 19:45:47 [serving.py:500] Traceback (most recent "
                                  "call last):"), "EngineDeadError")
    assert not request_error(line("(EngineCore pid=9) ERROR 12-06 19:45:47 [core.py:866] ValueError: boom"))


def test_a_death_by_a_signal_no_stop_sends_is_a_failure_and_a_stops_is_not(tmp_path):
    """A worker killed by SIGKILL or SIGSEGV while starting is a failure even when the death line is all the log
    says (0.32's executor, V0's worker monitor); one killed by SIGTERM/SIGINT was stopped (real/healthy/h203: the
    launcher sent SIGINT, the monitor saw the worker die with -15), and an exit code 0 ends healthy runs."""
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    def rules(*lines: str) -> list[str]:
        log = tmp_path / "x.log"
        log.write_text("".join(line + "\n" for line in lines))
        return [f.rule for f in diagnose_paths([str(log)], cached_catalog(None), Options(live=False)).findings]

    start = "INFO 08-18 03:43:30 [gpu_model_runner.py:2000] Starting to load model /m..."
    v1 = ("(EngineCore pid=1) ERROR 08-18 03:43:42 [multiproc_executor.py:150] Worker proc VllmWorker-0 died "
          "unexpectedly (exit code: {}), shutting down executor.")
    v0 = "ERROR 08-18 03:43:42 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 1558516 died, exit code: {}"
    for line in (v1, v0):
        assert rules(start, line.format(-9)) == ["unrecognized"], line
        assert rules(start, line.format(-11)) == ["unrecognized"], line
        assert rules(start, line.format(-15)) == [], line
    assert rules(start, v1.format(0)) == []


def test_a_burst_of_error_lines_is_cited_from_its_first_line(tmp_path):
    """One process logging several ERROR lines in the same second logs the failure first and its consequences
    after (real LMCache burst, d308: the file it could not read, then the token count it therefore missed). Lines of
    another second are another burst: the last one is cited alone."""
    from conftest import ROOT
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    log = ROOT / "logs_corpus/real/other/d308.log"
    d = diagnose_paths([str(log)], cached_catalog(None), Options(live=False))
    assert [f.rule for f in d.findings] == ["unrecognized"]
    assert d.findings[0].evidence[0].message.startswith("Failed to read from file")
    assert "Failed to read from file" in d.findings[0].facts["exception"]

    lines = log.read_text().splitlines()
    apart = tmp_path / "apart.log"
    apart.write_text("\n".join(lines[:3] + [lines[3].replace("09:10:17,149", "09:10:19,003")]) + "\n")
    d = diagnose_paths([str(apart)], cached_catalog(None), Options(live=False))
    assert [ln.message[:24] for ln in d.findings[0].evidence] == ["Num retrieved tokens: 0,"]


def test_what_the_resource_tracker_prints_and_goes_on_from_is_no_failure(tmp_path):
    """CPython's resource tracker prints an error of its loop with sys.excepthook and reads on (real vllm#5468: a
    shared-memory name unregistered twice under the multiprocessing backend). The same KeyError raised by any other
    frame is a failure."""
    tracker = ('Traceback (most recent call last):\n'
               '  File "/usr/lib/python3.10/multiprocessing/resource_tracker.py", line 209, in main\n'
               '    cache[rtype].remove(name)\n'
               "KeyError: '/psm_10b3d52e'\n")
    log = tmp_path / "tracker.log"
    log.write_text(tracker * 3)
    assert _rules(log) == []
    other = tmp_path / "other.log"
    other.write_text(tracker.replace("multiprocessing/resource_tracker.py", "vllm/distributed/shm.py"))
    assert _rules(other) == ["unrecognized"]


def test_the_engine_loops_record_of_its_end_is_a_failure_after_serving(tmp_path):
    """Real LMCache#412 (0.7, V0): the server answered 500, then MQLLMEngine.start logged repr(e) as its loop ended.
    A request handler's error and a stop's CancelledError in the same place are not the engine's end."""
    served = ('INFO 03-19 11:53:56 [cuda.py:282] Using XFormers backend.\n'
              'INFO:     127.0.0.1:41950 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n')
    died = tmp_path / "died.log"
    died.write_text(served + "ERROR 03-19 11:54:51 [engine.py:158] AssertionError('Only FlashAttention backend is "
                    "supported for now.')\n")
    assert _rules(died) == ["unrecognized"]
    handler = tmp_path / "handler.log"
    handler.write_text(served + "ERROR 03-19 11:54:51 [serving_completion.py:158] AssertionError('bad prompt')\n")
    assert _rules(handler) == []
    stopped = tmp_path / "stopped.log"
    stopped.write_text(served + "ERROR 03-19 11:54:51 [engine.py:158] CancelledError()\n")
    assert _rules(stopped) == []


def test_a_start_up_the_log_leaves_unfinished_is_said_not_called_all_clear(tmp_path):
    """Real vllm#9920 (its excerpt): the KV cache sized, then nothing; no error, no stop, never ready. The report
    stays an all-clear (exit 0) and says where the log ends. A served run, or a start-up with no phase, says none."""
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    def notices(text):
        log = tmp_path / "x.log"
        log.write_text(text)
        d = diagnose_paths([str(log)], cached_catalog(None), Options(live=False))
        assert d.findings == []
        return " ".join(d.notices)

    sized = ("INFO 11-01 23:16:20 model_runner.py:1025] Loading model weights took 13.4870 GB\n"
             "INFO 11-01 23:16:33 distributed_gpu_executor.py:56] # GPU blocks: 185231, # CPU blocks: 18724\n")
    assert "ends during start-up (allocating the KV cache)" in notices(sized)
    assert "ends during start-up" not in notices(sized + "INFO:     Application startup complete.\n")
    assert notices("INFO 11-01 23:16:33 [x.py:1] hello\n") == ""


@pytest.mark.parametrize("line, signum", [
    ("Killed", 9), ("Aborted (core dumped)", 6), ("Segmentation fault (core dumped)", 11),
    ("[1]+  Killed                  vllm serve Qwen/Qwen2-7B", 9),
    ("./serve.sh: line 3: 4242 Killed                  python -m vllm.entrypoints.openai.api_server", 9),
])
def test_a_shells_report_of_its_child_killed_by_a_signal_is_a_failure(line, signum, tmp_path):
    """Real ro21 (`Killed` after the KV cache, the host OOM killer) and xinference's `Aborted (core dumped)`
    (k209): the shell's job status is the only sign of the death. A word inside a sentence, or SIGTERM's
    `Terminated`, is none."""
    from vllm_doctor.events.deaths import shell_death

    assert shell_death(line) == signum
    log = tmp_path / "x.log"
    log.write_text("INFO 11-20 10:45:57 gpu_executor.py:102] # GPU blocks: 12453, # CPU blocks: 2730\n" + line + "\n")
    assert _rules(log) == ["unrecognized"]
    for other in ("Killed 3 idle workers", "Terminated", "INFO 11-20 10:45:58 [x.py:1] Aborted request cmpl-1."):
        assert shell_death(other) is None
        log.write_text("INFO 11-20 10:45:57 gpu_executor.py:102] # GPU blocks: 12453\n" + other + "\n")
        assert _rules(log) == []


@pytest.mark.parametrize("line, signum", [
    # absl's handler in a Ray worker (real a606, vllm#12568), glog's, Python's faulthandler, ROCm's GPU page fault
    ("(RayWorkerWrapper pid=4823, ip=10.233.68.253) *** SIGSEGV received at time=1739339449 on cpu 57 ***", 11),
    ("*** SIGABRT (@0x3e80000004f) received by PID 79 (TID 0x7f3a) from PID 79; stack trace: ***", 6),
    ("Fatal Python error: Segmentation fault", 11),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55d1) on address 0x7f5e5b000. Reason: Unknown.", 6),
    # a container runtime's: kubectl describe (a production-stack CPU tutorial: AVX-512 build on a Milan CPU),
    # Compose, and Kubernetes' memory-limit kill
    ("     Last State:     Terminated ││       Reason:       Error ││       Exit Code:    132      ", 4),
    ("vllm-1 exited with code 139", 11),
    ("      Reason:       OOMKilled", 9),
    # zsh's words: a foreground job, and a background one (vllm#4077, real y402: a corrupt libnccl)
    ("zsh: killed     python -m vllm.entrypoints.openai.api_server --model m", 9),
    ("[1]    842586 bus error  python3 collect_env.py", 7),
])
def test_a_native_handlers_report_of_a_crash_signal_is_a_failure(line, signum, tmp_path):
    """The process's own last words on a crash signal: a failure by themselves, never an all-clear; a stop's SIGTERM
    in the same words is none, and after the stop of a served run (real hv032-tp2-sigint) a crash is its shutdown."""
    from conftest import ROOT
    from vllm_doctor.events.deaths import death_signal

    assert death_signal(parse_line(line).message) == signum
    log = tmp_path / "x.log"
    log.write_text("INFO 11-20 10:45:57 gpu_executor.py:102] # GPU blocks: 12453, # CPU blocks: 2730\n" + line + "\n")
    assert _rules(log) == ["unrecognized"]
    for other in ("*** SIGTERM received at time=1739339449 on cpu 57 ***", "Fatal Python error: init_fs_encoding",
                  "zsh: terminated  python3 serve.py", "[2]  + 4242 done       vllm serve m",
                  "vllm-1 exited with code 137", "vllm-1 exited with code 143", "      Exit Code:    0"):
        assert death_signal(other) is None
        log.write_text("INFO 11-20 10:45:57 gpu_executor.py:102] # GPU blocks: 12453\n" + other + "\n")
        assert _rules(log) == []
    stopped = tmp_path / "stopped.log"
    stopped.write_text((ROOT / "logs_corpus/real/healthy/v032cpu-tp2-healthy-sigint.log").read_text() + line + "\n")
    assert _rules(stopped) == []



def test_a_hosting_platforms_report_that_the_container_failed_is_a_failure(tmp_path):
    """Modal's runner killing a start-up that outlived its timeout (real l404, modal-examples#1154) is a failure the
    doctor cannot name, never an all-clear; its report of a stop outliving the grace period is a stop's."""
    from vllm_doctor.events.deaths import platform_failed

    head = "INFO 05-01 12:39:12 backends.py:311] Cache the graph of shape None for later use\n"
    log = tmp_path / "x.log"
    log.write_text(head + "Runner failed with exception: Runner has been initializing for too long: 300 seconds\n")
    assert _rules(log) == ["unrecognized"]
    stop = "Runner failed with exception: Runner has been shutting down for too long (grace period: 30 seconds)"
    assert not platform_failed(stop)
    log.write_text(head + stop + "\n")
    assert _rules(log) == []

def test_a_traceback_pythons_unraisable_hook_printed_is_no_failure():
    from vllm_doctor.events.tracebacks import failing

    tail = ('Traceback (most recent call last):\n'
            '  File "/w/vllm_hpu/worker/hpu_model_runner.py", line 3130, in __del__\n'
            'ImportError: sys.meta_path is None, Python is likely shutting down\n')
    # logs_corpus/real/healthy/q805.log: a finished offline run, then a finalizer failing at interpreter exit
    [ignored] = _tracebacks("Exception ignored in: <function HPUModelRunner.__del__ at 0x7f11eff56440>\n" + tail)
    assert ignored.ignored and not failing(ignored)
    # the same traceback without the hook's header is a failure, and so is one a line after it
    [plain] = _tracebacks(tail)
    assert failing(plain)
    [later] = _tracebacks("Exception ignored in: <function f at 0x1>\nsome other line\n" + tail)
    assert failing(later)


def test_requests_running_at_zero_tokens_to_the_end_of_the_log_are_a_hang():
    from vllm_doctor.diagnosis.stuck import StuckRequests

    def stats(gen: str, running: int) -> str:
        return (f"INFO 05-11 18:07:24 [loggers.py:111] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
                f"throughput: {gen} tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%")

    def run(lines: list[str]) -> StuckRequests:
        stuck = StuckRequests()
        for n, text in enumerate(lines, 1):
            stuck.feed(parse_line(text, "x.log", n), n)
        return stuck

    # logs_corpus/real/other/t802.log: one request at 0 tokens/s for four intervals, to the end
    assert len(run([stats("31.2", 1)] + [stats("0.0", 1)] * 4).hung()) == 2
    assert run([stats("0.0", 1)] * 2).hung() == []                       # a pause, not a hang
    assert run([stats("0.0", 1)] * 4 + [stats("12.5", 1)]).hung() == []  # it went on
    assert run([stats("0.0", 0)] * 5).hung() == []                       # idle: nothing running


def test_a_stuck_run_is_a_hang_unless_a_stop_came_after_it(tmp_path):
    import json

    from conftest import run_main

    stats = ("INFO 05-11 18:07:{:02d} [loggers.py:111] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
             "throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs")
    lines = ["INFO 05-11 18:07:00 [api_server.py:1] Application startup complete."] + [stats.format(s) for s in (24, 34, 44)]
    hung, stopped = tmp_path / "hung.log", tmp_path / "stopped.log"
    hung.write_text("\n".join(lines) + "\n")
    stopped.write_text("\n".join(lines + ["INFO 05-11 18:07:50 [launcher.py:1] Shutting down FastAPI HTTP server."]) + "\n")
    report = json.loads(run_main("--no-live", "--format", "json", hung).stdout)
    assert [f["title"] for f in report["findings"]] == ["The server stopped making progress while serving"]
    # the user stopped the server after those lines: a served run that was stopped (stop-after-serving)
    assert run_main("--no-live", stopped).returncode == 0


def test_a_logged_tracebacks_body_without_its_header_is_no_error_message(tmp_path):
    """vllm#28997's paste (e901): the engine core's ERROR lines of a traceback whose header and exception the paste
    cut: its position markers (`^^^^`) and frames are not the failure's words; the finding says the traceback is
    cut instead of quoting carets."""
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import cached_catalog

    head = "(EngineCore_DP0 pid=1773285) ERROR 11-18 22:45:34 [v1/engine/core.py:842] "
    log = tmp_path / "cut.log"
    log.write_text(head + "           ^^^^^^^^^^^^^^^^^^^^^^^^\n"
                   + head + '  File "/venv/vllm/v1/worker/worker_base.py", line 343, in execute_method\n'
                   + head + "           ^^^^^^^^^^^^^^^^^^^\n")
    [finding] = diagnose_paths([str(log)], cached_catalog(None), Options(live=False)).findings
    assert finding.rule == "unrecognized" and "cuts off before its exception" in finding.explanation
    assert "^^^" not in finding.evidence[0].message
