"""Real logs as pasted: damaged lines, traceback fragments, retyped messages, and no false all-clear.

Each input is a line (or lines) copied from a real log in logs_corpus/real/ (the case is named), or a
variant of one, said so where it is."""
from __future__ import annotations

import pytest

from conftest import run_cli
from vllm_doctor.sources.tolerant import readings

HEADS = "Total number of attention heads (40) must be divisible by tensor parallel size (3)."


@pytest.mark.parametrize("damaged, repaired", [
    # rsyslog's #033 / #015 escapes (real/parallel rp28)
    ("#033[1;36m(pid=1)#033[0;0m AssertionError: 12 is not divisible by 8#015", "AssertionError: 12 is not divisible by 8"),
    # xinference's actor tag between the type and the message (real/platform rg25)
    ("RuntimeError: [address=0.0.0.0:38231, pid=2088] Device string must not be empty",
     "RuntimeError: Device string must not be empty"),
    # a capability check printed as a tuple of fragments (variant of real/platform rg02's line)
    ("ValueError: ('Bfloat16 is only supported on GPUs with compute capability of at least 8.0. ', "
     "'Your Tesla T4 GPU has compute capability 7.5.')",
     "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has "
     "compute capability 7.5."),
])
def test_readings_repair_the_damage(damaged, repaired):
    assert repaired in readings(damaged)


def test_a_clean_line_has_no_other_reading():
    assert readings(f"ValueError: {HEADS}") == []


def test_blanks_a_terminal_left_inside_a_word():
    # real/config rc29's damage, on the heads message (a variant)
    got = readings("ValueError: Total number of attention heads (40) must be divisi      ble by tensor parallel size (3).")
    assert f"ValueError: {HEADS}" in got


def _rule(tmp_path, text: str, *args) -> tuple[str | None, int]:
    import json

    log = tmp_path / "pasted.log"
    log.write_text(text)
    proc = run_cli("--no-live", "--format", "json", *args, str(log))
    findings = json.loads(proc.stdout)["findings"]
    return (findings[0]["rule"] if findings else None), proc.returncode


def test_a_wrapped_exception_whose_continuation_lost_its_prefix(tmp_path):
    # real/memory rm05: the paste wrapped mid-word and the continuation has no (EngineCore pid=...) prefix
    text = ("(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), "
            "(4.26 GiB KV cach\ne is needed, which is larger than the available KV cache memory (4.25 GiB). Based on "
            "the available memory, the estimated maximum model length is 99808. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n")
    assert _rule(tmp_path, text) == ("kv-cache-insufficient", 1)


def test_a_headerless_fragment_ending_in_raise_is_placed_by_its_function(tmp_path):
    # variant of real/config rc23 / platform rg16: frames of the registry's subprocess, no header, cut at raise
    text = ('  File "/venv/lib/python3.10/site-packages/vllm/model_executor/models/registry.py", line 494, in '
            '_run_in_subprocess\n    raise RuntimeError(f"Error raised in subprocess:\\n"\n')
    assert _rule(tmp_path, text) == ("install-broken", 1)


def test_an_orphan_exception_after_headerless_frames(tmp_path):
    # real/parallel rp21's shape: File lines without a header, the exception printed after them
    text = ('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 130, in init_device\n'
            '    assert self.local_rank < torch.cuda.device_count()\n'
            'AssertionError: local_world_size (16) must be less than or equal to the number of visible devices (8).\n')
    rule, rc = _rule(tmp_path, text)
    assert rc == 1 and rule is not None


@pytest.mark.parametrize("text", [
    "ValueError: some failure nobody wrote a rule for\n",                    # a lone pasted exception line
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",  # rp27
])
def test_no_false_all_clear(tmp_path, text):
    assert _rule(tmp_path, text) == ("unrecognized", 1)




def _assembled(text: str) -> list:
    """The tracebacks the assembler makes of `text`, read as one pasted log."""
    from vllm_doctor.events.tracebacks import TracebackAssembler
    from vllm_doctor.sources.lines import parse_line

    assembler = TracebackAssembler()
    for n, raw in enumerate(text.splitlines(), 1):
        assembler.feed(parse_line(raw, "pasted.log", n))
    assembler.close()
    return assembler.finished

def test_ipythons_traceback_is_read_cut_or_whole(tmp_path):
    """IPython prints the exception's name first and its frames as `<file> in f()` (real n408: a Colab paste cut
    inside its frames); the assembler reads its frames and its last line as Python's."""
    head = ("---------------------------------------------------------------------------\n"
            "RuntimeError                              Traceback (most recent call last)\n"
            "[/usr/local/lib/python3.11/dist-packages/vllm/worker/worker.py](https://localhost:8080/#) in "
            "load_model(self)\n"
            "    181     def load_model(self):\n"
            "--> 182         self.model_runner.load_model()\n")
    assert _rule(tmp_path, head) == ("unrecognized", 1)
    [tb] = _assembled(head + "RuntimeError: something only this run says\n")
    assert tb.ipython and tb.exc_type == "RuntimeError" and tb.funcs == ["load_model"] and tb.stray == 0


def test_richs_boxed_traceback_is_read_cut_or_whole(tmp_path):
    """rich.traceback's box (real v406: FastChat-era api_server, the paste cut inside the box) is a traceback: a
    failure, never an all-clear; whole, its frames and exception are read."""
    head = ("INFO 07-19 02:29:31 llm_engine.py:134] # GPU blocks: 915, # CPU blocks: 512\n"
            "╭──────────────────── Traceback (most recent call last) ────────────────────╮\n"
            "│ /workdir/vllm/vllm/transformers_utils/tokenizer.py:36 in get_tokenizer    │\n"
            "│                                                                           │\n"
            "│   35 │   │   │   raise ValueError(                                        │\n")
    assert _rule(tmp_path, head) == ("unrecognized", 1)
    [tb] = _assembled(head + "╰───────────────────────────────────────────────────────────────────────────╯\n"
                      "ValueError: boom\n")
    assert tb.rich and tb.exc_type == "ValueError" and tb.funcs == ["get_tokenizer"] and tb.frames[0].lineno == 36

def test_ctrl_c_and_python_warnings_are_no_failure(tmp_path):
    text = ("FutureWarning: `resume_download` is deprecated and will be removed in version 1.0.0.\n"
            "Traceback (most recent call last):\n  File \"/x.py\", line 1, in <module>\nKeyboardInterrupt\n")
    assert _rule(tmp_path, text) == (None, 0)


@pytest.mark.parametrize("text, rule", [
    # real/config rc30: retyped in lower case, a curly quote
    ("valueerror: loading internvl2-8b/ requires you to execute the configuration file in that repo on your local "
     "machine. make sure you have read the code there to avoid malicious use, then set the option "
     "'trust_remote_code=true’ to remove this error.\n", "trust-remote-code"),
    # real/config rc33: a letter lost ("sockethas")
    ("RuntimeError: The server sockethas failed to listen on any local network address. port: 40005, useIpv6: 0, "
     "code: -98, name: EADDRINUSE, message: address already in use\n", "port-in-use"),
])
def test_retyped_messages_are_read_with_low_confidence(tmp_path, text, rule):
    import json

    log = tmp_path / "retyped.log"
    log.write_text(text)
    top = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)["findings"][0]
    assert top["rule"] == rule and top["confidence"] == "low"


def test_a_short_phrase_alone_names_no_rule(tmp_path):
    # real/other ro20: "No module named 'bitsandbytes'" shares a phrase with install-broken's pattern only
    assert _rule(tmp_path, "ModuleNotFoundError: No module named 'bitsandbytes'\n")[0] == "unrecognized"


def test_an_edit_in_a_short_word_is_another_message(tmp_path):
    # vLLM 0.33's `--enable-hc-sp is not supported for this model` (found by the coverage table) is one edit
    # from pp-unsupported's `PP is not supported for this model`; the short word `PP` must be there whole
    assert _rule(tmp_path, "ValueError: --enable-hc-sp is not supported for this model\n")[0] == "unrecognized"
    assert _rule(tmp_path, "RuntimeError: PP is not suported for this model\n")[0] == "pp-unsupported"


def test_empty_pipe_input_is_an_input_error():
    proc = run_cli("--no-live", "-", input=b"")
    assert proc.returncode == 2 and "empty" in proc.stderr.decode() and proc.stdout == b""


@pytest.mark.parametrize("func, file, rule", [
    ("_check_enough_kv_cache_memory", "vllm/v1/core/kv_cache_utils.py", "kv-cache-insufficient"),
    ("_check_if_gpu_supports_dtype", "vllm/worker/worker.py", "compute-capability"),
    ("_get_and_verify_max_len", "vllm/config.py", "max-model-len-too-large"),
])
def test_a_traceback_cut_at_raise_is_placed_by_vllms_checker(tmp_path, func, file, rule):
    # variant of real/memory rm05 (its frames, unwrapped) cut before the exception's message
    text = ("Traceback (most recent call last):\n"
            f'  File "/opt/venv/lib/python3.12/site-packages/{file}", line 758, in {func}\n'
            "    raise ValueError(\n")
    assert _rule(tmp_path, text) == (rule, 1)


def test_a_retyped_line_vllm_printed_as_a_warning_follows_warning_is_no_cause(tmp_path):
    """A retyped reading of a WARNING line (found by the fuzzer: an IndexError ended the run). vLLM went on
    after it, so it names no cause, unless its pattern's line alone does (`warning_alone`: an undefined
    symbol in vllm/_C, real/platform rg32's first line with two letters flipped)."""
    symbol = ("WARNING 12-30 17:06:52 _custom_ops.py:19] Failed to import from vllm._C with ImportError('/usr/locad/"
              "app/.local/lib/pytho~3.8/site-packages/vlll/_C.abi3.so: undefined symbol: cuTensorMapEncodeTiled')\n")
    assert _rule(tmp_path, symbol) == ("install-broken", 1)
    gpus = "WARNING 01-01 00:00:00 worker.py:1] RuntimeError: No CUDA GPUs are availabel\n"     # one edit
    assert _rule(tmp_path, gpus)[0] != "no-gpu"
    assert _rule(tmp_path, gpus.split("] ", 1)[1]) == ("no-gpu", 1)          # the same, as an exception
