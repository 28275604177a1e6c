"""Sources: line parsing across vLLM versions, and the scanner seeing exactly what a full read sees."""
import random

from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.sources.lines import parse_line
from vllm_doctor.sources.scan import Scanner


def test_prefixes_and_headers():
    ln = parse_line(b"\x1b[1;36m(VllmWorkerProcess pid=123)\x1b[0;0m ERROR 05-12 10:11:12 worker_base.py:572] "
                    b"Traceback (most recent call last):\r\n")
    assert (ln.proc, ln.pid, ln.level, ln.message) == ("VllmWorkerProcess", 123, "ERROR",
                                                        "Traceback (most recent call last):")
    ln = parse_line("(RayWorkerWrapper pid=3223, ip=10.1.2.3) ERROR 02-04 00:18:05 worker_base.py:572] boom")
    assert (ln.proc, ln.ip, ln.message) == ("RayWorkerWrapper", "10.1.2.3", "boom")
    ln = parse_line("(Worker_TP1 pid=9) INFO 11-30 23:40:24 [gpu_worker.py:88] hello")
    assert (ln.proc, ln.fileinfo, ln.message) == ("Worker_TP1", "gpu_worker.py:88", "hello")
    ln = parse_line("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught")
    assert (ln.rank, ln.level, ln.message) == (0, "ERROR", "[Rank 0] Watchdog caught")
    ln = parse_line("INFO 05-12 10:11:12 llm_engine.py:98] Initializing an LLM engine")
    assert ln.message == "Initializing an LLM engine" and ln.fileinfo == "llm_engine.py:98"


def test_xinference_headers_give_the_level_and_the_machine():
    """xinference's two logging formats (to 1.x: Python's `%(asctime)s %(name)-12s %(process)d %(levelname)-8s`;
    2.x: its TextFileFormatter, whose `node:` is the host name) give the level and the second; a vLLM line is
    read as before, and a plain date that starts a message is no header."""
    ln = parse_line("2025-04-15 10:15:22,015 xinference.core.worker 48577 ERROR    Failed to load model qwen-0")
    assert (ln.level, ln.stamp, ln.message, ln.host) == ("ERROR", "04-15 10:15:22", "Failed to load model qwen-0", None)
    ln = parse_line("2026-08-07T18:25:43.623Z WARNING xinference.core.worker pid:41 role:worker "
                    "address:10.0.0.2:26776 node:gpu-b Model qwen3 is slow")
    assert (ln.level, ln.stamp, ln.host, ln.message) == ("WARNING", "08-07 18:25:43", "gpu-b", "Model qwen3 is slow")
    ln = parse_line("2025-04-15 10:15:22,015 the server stopped")
    assert ln.level is None and ln.message == ln.raw


def test_lmcache_header_gives_the_level():
    """LMCache's own formatter (lmcache/logging.py), coloured whatever the output."""
    ln = parse_line(b"\x1b[31;20m[2025-05-17 09:10:17,149] LMCache ERROR:\x1b[0m Failed to read from file /f.data "
                    b"\x1b[3m(fs_connector.py:106:lmcache.storage)\x1b[0m")
    assert (ln.level, ln.stamp) == ("ERROR", "05-17 09:10:17") and ln.message.startswith("Failed to read from file")
    assert parse_line("[2025-05-17 09:10:17,149] LMCache INFO: Reqid: chatcmpl-1").level == "INFO"


def test_a_header_at_the_start_of_a_line_is_looked_at(catalog):
    """An ERROR line with no prefix and no other word a rule knows (V0's `ERROR 06-01 …`) reaches the engine: the
    scanner's literals name the level and the month after it, so a start-up that ends at it is no all-clear."""
    from vllm_doctor.diagnosis.engine import Diagnoser as D

    d = D(catalog)
    seen = []
    sc = Scanner(d.scan_literals, type("S", (), {"feed": lambda self, ln, key=None: seen.append(ln.lineno),
                                                  "needs_context": False, "repeats": None})())
    sc.feed(b"INFO 06-01 22:29:39 transformers.py:132] Using Transformers backend.\n"
            b"ERROR 06-01 22:29:41 engine.py:389] TransformersModel does not support LoRA yet.\n"
            b"CRITICAL 12-17 03:26:10 [core_client.py:269] Got fatal signal from worker processes, shutting down.\n")
    sc.close()
    assert seen == [2, 3]


def test_a_markdown_quote_before_a_ray_prefix_is_no_part_of_it():
    """OpenRLHF#265's paste starts with the backtick its Markdown quote left: the prefix still names the node."""
    ln = parse_line("`(RayWorkerVllm pid=207931, ip=10.0.1.75) [E socket.cpp:922] [c10d] The client socket has timed out")
    assert (ln.proc, ln.pid, ln.ip) == ("RayWorkerVllm", 207931, "10.0.1.75")
    assert parse_line("`code` (x)").message == "`code` (x)"


def test_invalid_utf8_never_raises():
    ln = parse_line(b"\xff\xfe\x00 ValueError: \xc3")
    assert "ValueError" in ln.message


class Recorder:
    def __init__(self, diagnoser):
        self.d = diagnoser
        self.lines = []

    @property
    def needs_context(self):
        return self.d.needs_context

    def feed(self, line):
        self.lines.append((line.lineno, line.raw))
        self.d.feed(line)


def test_scanner_line_numbers_survive_any_chunking(catalog):
    lines = [f"(APIServer pid=1) INFO 12-01 00:00:{i % 60:02d} [x.py:1] Avg prompt throughput {i}" for i in range(3000)]
    lines[1234] = "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3)."
    lines[2500] = "Traceback (most recent call last):"
    lines[2501] = '  File "x.py", line 3, in f'
    lines[2502] = "RuntimeError: boom"
    data = ("\n".join(lines) + "\n").encode()
    seen = None
    for _ in range(5):
        rec = Recorder(Diagnoser(catalog))
        scanner = Scanner(rec.d.scan_literals, rec, source="x")
        pos = 0
        while pos < len(data):
            step = random.randint(1, 5000)
            scanner.feed(data[pos:pos + step])
            pos += step
        scanner.close()
        assert scanner.lineno == 3000
        got = [n for n, raw in rec.lines]
        assert 1235 in got and 2501 in got and 2502 in got and 2503 in got
        assert dict(rec.lines)[1235].startswith("ValueError: Total number")
        seen = seen or rec.lines
        assert rec.lines == seen


def _scan_lines(catalog, data, step):
    rec = Recorder(Diagnoser(catalog))
    scanner = Scanner(rec.d.scan_literals, rec, source="x")
    for pos in range(0, len(data), step):
        scanner.feed(data[pos:pos + step])
    scanner.close()
    return scanner.lineno, rec.lines


def test_big_blocks_scanned_in_parallel_parts_see_what_small_reads_see(catalog, monkeypatch):
    """A big block is cut at newlines into parts looked at side by side; hits on either side of a cut,
    and the line count, must be exactly those of a scan in small pieces (one search thread or several,
    newlines counted by bytes.count or numpy)."""
    from vllm_doctor.sources import scan

    filler = [f"(APIServer pid=1) INFO 12-01 00:00:{i % 60:02d} [x.py:1] Avg prompt throughput {i}"
              for i in range(40000)]
    total = len(filler)
    for at in (0, total // 4, total // 2 - 1, total // 2, total // 2 + 1, total - 1):
        filler[at] = f"ValueError: Total number of attention heads (40) must be divisible by tensor parallel size ({at})."
    data = ("\n".join(filler) + "\n").encode()
    assert len(data) > 4 * scan.PARALLEL_MIN
    small = _scan_lines(catalog, data, 4096)
    # the six failures, each with at most the one line after it (a lone exception line may continue there)
    assert small[0] == total and sum("ValueError" in text for _, text in small[1]) == 6 and len(small[1]) <= 12
    assert _scan_lines(catalog, data, len(data)) == small
    assert _scan_lines(catalog, data, 700_001) == small
    monkeypatch.setattr(scan, "_POOL_SIZE", 1)
    assert _scan_lines(catalog, data, len(data)) == small
    monkeypatch.setattr(scan, "_POOL_SIZE", 3)
    assert _scan_lines(catalog, data, 900_001) == small
    monkeypatch.setattr(scan, "NUMPY_AFTER", 0)          # a big input's newlines counted by numpy
    assert _scan_lines(catalog, data, len(data)) == small
    monkeypatch.setattr(scan, "_NUMPY", False)            # ... or by bytes.count without numpy
    assert _scan_lines(catalog, data, len(data)) == small


def test_candidate_line_right_after_a_fed_line(catalog):
    """A candidate that starts exactly where the previous one ended is seen once, with its own number."""
    data = (b"ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n"
            b"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nKeyError: 'mistral'\n")
    rec = Recorder(Diagnoser(catalog))
    scanner = Scanner(rec.d.scan_literals, rec, source="x")
    scanner.feed(data)
    scanner.close()
    assert [n for n, _ in rec.lines] == [1, 2, 3, 4]


def test_compose_prefix():
    ln = parse_line("vllm-1  | (APIServer pid=1) ERROR 12-01 00:00:00 [x.py:1] OSError: [Errno 98] Address already in use")
    assert ln.pid == 1 and ln.message == "OSError: [Errno 98] Address already in use"



def test_a_log_viewers_timestamp_column_is_no_part_of_the_line():
    """`2026-05-01 19:03:56.222 | …` (a viewer's export of a compose service's log): the line after the bar is
    read as it was printed; a Python logging header of the same date shape has no bar and stays the line's."""
    ln = parse_line("2026-05-01 19:03:56.222 | vllm: error: unrecognized arguments: --task generate")
    assert ln.message == "vllm: error: unrecognized arguments: --task generate"
    ln = parse_line("2026-05-01 19:03:56.126 | (APIServer pid=1) WARNING 05-01 17:03:56 [interface.py:686] Using "
                    "'pin_memory=False' as WSL is detected.")
    assert ln.pid == 1 and ln.level == "WARNING" and ln.message.startswith("Using 'pin_memory=False'")
    ln = parse_line("2025-01-02 10:00:00,123 - vllm_runner - ERROR - ValueError: boom")
    assert "ValueError: boom" in ln.message
    # the same column as a table row a web console pasted (vllm#14413: Ray Data's actor, nbsp before the bar)
    ln = parse_line("\xa0 | 2025-03-07T05:56:27.270Z | (_MapWorker pid=13019) ERROR 03-07 05:56:27 worker_base.py:581] "
                    "RuntimeError: No CUDA GPUs are available")
    assert ln.proc == "_MapWorker" and ln.pid == 13019 and ln.message == "RuntimeError: No CUDA GPUs are available"
    assert parse_line(" | not a stamp | x").message == " | not a stamp | x"
    # a launcher's stamp and level around vLLM's own prefix (real z406, vllm#50098): the level is the launcher's
    ln = parse_line("2026-07-28 06:23:24 [ERROR]   (APIServer pid=551960)   File \"/v/vllm/config/speculative.py\", "
                    "line 1277, in _verify_args")
    assert ln.pid == 551960 and ln.level is None and ln.message.startswith('  File "/v/vllm/config/speculative.py"')
    ln = parse_line("2026-07-28 06:23:24 [ERROR] something a launcher says itself")
    assert ln.message.endswith("[ERROR] something a launcher says itself")


def test_colours_in_caret_notation_are_no_part_of_the_line():
    """`cat -v` or a terminal's copy writes ESC as `^[`: the colour codes around Ray's prefix go, as real ones do."""
    ln = parse_line("^[[36m(RayWorkerWrapper pid=4823, ip=10.233.68.253)^[[0m *** SIGSEGV received at time=1739339449 "
                    "on cpu 57 ***")
    assert ln.pid == 4823 and ln.ip == "10.233.68.253" and ln.message.startswith("*** SIGSEGV received")

def test_unprefixed_traceback_tail_is_given_up_among_prefixed_lines(catalog):
    """An API-server traceback without a prefix must not make the scanner feed every later line."""
    d = Diagnoser(catalog)
    d.feed(parse_line("Traceback (most recent call last):"))
    d.feed(parse_line('  File "x.py", line 1, in f'))
    d.feed(parse_line("ValueError: boom"))
    assert d.needs_context
    for i in range(60):
        d.feed(parse_line(f"(Worker_TP1 pid=7) INFO 12-01 00:00:00 [x.py:1] line {i}"))
    assert not d.needs_context
    assert d.tracebacks.finished[0].exc_type == "ValueError"


def test_traceback_logged_as_the_tail_of_a_message_is_assembled(catalog):
    """vLLM 0.7-0.8 V1: `EngineCore hit an exception: Traceback (most recent call last):`, each line prefixed."""
    head = "ERROR 03-20 12:01:10 [core.py:340] "
    d = Diagnoser(catalog)
    for text in ["EngineCore hit an exception: Traceback (most recent call last):",
                 '  File "/x/vllm/v1/engine/core.py", line 332, in run_engine_core',
                 "    engine_core = EngineCoreProc(*args, **kwargs)",
                 "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."]:
        d.feed(parse_line(head + text))
    d.feed(parse_line("CRITICAL 03-20 12:01:10 [core_client.py:269] Got fatal signal from worker processes"))
    d.tracebacks.close()
    tb = d.tracebacks.finished[0]
    assert tb.exc_type == "ray.exceptions.OutOfMemoryError"
    assert [f.func for f in tb.frames] == ["run_engine_core"]


def test_rsyslog_escaped_colour_codes_are_removed_like_ansi():
    """rsyslog writes ESC as `#033` (real: a Ray worker's prefix in /var/log/messages, vllm#1160): the prefix is
    read as the process it names, as with the raw escape."""
    from vllm_doctor.sources.lines import clean_text, parse_line

    raw = "#033[2m#033[36m(RayWorkerVllm pid=5085, ip=10.0.0.2)#033[0m INFO 01-01 00:00:00 worker.py:1] x"
    assert clean_text(raw) == "(RayWorkerVllm pid=5085, ip=10.0.0.2) INFO 01-01 00:00:00 worker.py:1] x"
    assert parse_line(raw).ip == parse_line(raw.replace("#033", "\x1b")).ip == "10.0.0.2"
    assert clean_text("issue #0334 [x]m") == "issue #0334 [x]m"


def test_an_asctime_level_pid_file_header_and_a_caret_notation_cr():
    """Real vllm#11366: a logging config of the `%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d]`
    shape, each line ending in `^M` (a CR as `cat -v` shows it): the level, the file and the message are read."""
    from vllm_doctor.sources.lines import clean_text, parse_line

    raw = ("2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] RuntimeError: Error in model execution: CUDA "
           "error: an illegal memory access was encountered^M")
    ln = parse_line(raw)
    assert (ln.level, ln.fileinfo) == ("ERROR", "async_llm_engine.py:64")
    assert ln.message == "RuntimeError: Error in model execution: CUDA error: an illegal memory access was encountered"
    assert clean_text("echo ^M is a CR") == "echo ^M is a CR"


def test_a_wrapper_scripts_logged_launch_is_the_command_and_other_labels_are_not():
    from vllm_doctor.events.logfacts import logged_command

    # logs_corpus/real/config/n807.log: a deploy script logging what it starts
    line = ("2025-06-20 20:02:21,014 - __main__ - INFO - Command: python -m vllm.entrypoints.openai.api_server "
            "--model Qwen/Qwen3-30B-A3B --port 8000 --max-model-len 32768")
    assert logged_command(line) == ("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-30B-A3B "
                                    "--port 8000 --max-model-len 32768")
    assert logged_command("[launch] Running: vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2") == (
        "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2")
    for other in ("INFO 06-01 10:00:00 [loggers.py:1] Running: 1 reqs, Waiting: 0 reqs",
                  "Command: ls -la /models",                      # no vLLM launch
                  "Running: vllm serve",                          # no flags: nothing to rewrite
                  "Executing: pip install vllm --upgrade"):
        assert logged_command(other) is None


WATCHDOG = ("afol-apiserver-72b-1  | (RayWorkerVllm pid=3779) [E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=16487777, OpType=ALLREDUCE, NumelIn=195911680, NumelOut=19591168")


def _rules(tmp_path, text: str) -> list[str]:
    import json

    from conftest import run_main

    log = tmp_path / "wrapped.log"
    log.write_text(text)
    return [f["rule"] for f in json.loads(run_main("--no-live", "--format", "json", log).stdout)["findings"]]


def test_a_rule_line_a_terminal_cut_at_its_width_is_read_whole(tmp_path):
    # logs_corpus/real/nccl/t809.log: `docker compose logs` cut the watchdog's line inside a number
    rest = "0, Timeout(ms)=1800000) ran for 1800203 milliseconds before timing out.    \n"
    assert _rules(tmp_path, WATCHDOG + "\n" + rest) == ["nccl-timeout"]
    # the next line is a record of its own (a header): nothing to join, and the cut line alone matches nothing
    header = "afol-apiserver-72b-1  | INFO 03-01 10:00:00 [loggers.py:1] Running: 0 reqs\n"
    assert "nccl-timeout" not in _rules(tmp_path, WATCHDOG + "\n" + header)
