"""Flag knowledge against the reference notes (vllm-flags.txt / vllm-flags-history.md)."""
import pytest

from vllm_doctor.command import flags as F
from vllm_doctor.command.argcheck import accepts
from vllm_doctor.command.versions import compare, parse_version


def test_canonical():
    assert F.canonical("-tp") == "--tensor-parallel-size"
    assert F.canonical("--max_model_len") == "--max-model-len"
    assert F.canonical("--dtype=half") == "--dtype"
    assert F.canonical("-O3") == "--optimization-level"
    assert F.canonical("--device-memory-utilization") == "--gpu-memory-utilization"


@pytest.mark.parametrize("flag,version,known", [
    ("--tensor-parallel-size", None, True), ("-tp", "0.1.7", True), ("-dp", "0.8.2", False), ("-dp", "0.8.3", True),
    ("--swap-space", "0.17.0", True), ("--swap-space", "0.18.0", False), ("--worker-use-ray", "0.6.6", True),
    ("--worker-use-ray", "0.7.0", False), ("--max-seq-len", None, False), ("--max-seq-len", "0.4.2", False),
    ("--max-seq-len", "0.4.3", True), ("--max-seq-len", "0.10.2", True), ("--max-seq-len", "0.11.0", False),
    ("--max-context-len", "0.3.3", True), ("--max-model", None, True), ("--gpu-mem", None, True),
    ("--max_model_len", "0.5.1", True), ("--max_model_len", "0.5.0", False), ("--no-trust-remote-code", None, True),
    ("--task", "0.12.0", True), ("--task", "0.13.0", False), ("--compilation-config.mode", None, True),
    ("--max", None, False),   # ambiguous abbreviation: argparse refuses it
])
def test_is_known(flag, version, known):
    assert F.is_known(flag, version) is known


def test_silent_abbreviation():
    assert F.silently_abbreviates("--max-seq-len", "0.6.3") == "--max-seq-len-to-capture"
    assert F.silently_abbreviates("--max-seq-len", "0.11.0") is None
    assert F.silently_abbreviates("--max-context-len", "0.3.3") == "--max-context-len-to-capture"
    assert F.silently_abbreviates("--max-model-len", "0.6.3") is None   # exact match, not an abbreviation


def test_did_you_mean():
    assert F.suggest("--max-seq-len")[0] == "--max-model-len"
    assert F.suggest("--max-context-len")[0] == "--max-model-len"
    assert F.suggest("--tp")[0] == "--tensor-parallel-size"
    assert F.suggest("--tensor-parallel")[0] == "--tensor-parallel-size"
    assert F.suggest("--gpu-memory-util")[0] == "--gpu-memory-utilization"
    assert F.suggest("--enforce-eagr")[0] == "--enforce-eager"
    assert F.suggest("--swap-space") == [] or "--swap-space" not in F.suggest("--swap-space")


def test_replacement():
    assert F.replacement("--worker-use-ray") [0] == "--distributed-executor-backend"
    assert F.replacement_value("--worker-use-ray") == "ray"
    new, note = F.replacement("--swap-space", "0.20.0")
    assert new is None and "0.18.0" in note
    assert F.replacement("--task")[0] == "--runner"
    assert F.replacement("--max-model-len") == (None, "")


def test_choices_and_normalize():
    assert F.choices("--dtype") == ["auto", "half", "float16", "bfloat16", "float", "float32"]
    assert F.choices("--dtype", "0.1.7") == ["auto", "half", "bfloat16", "float"]
    # the parser's choices from vLLM's CacheDType, as real builds print them: fp8 yes, fp4 and bf16 no
    kv = F.choices("--kv-cache-dtype")
    assert "fp8" in kv and "fp8_e5m2" in kv and "fp4" not in kv and "bf16" not in kv
    for bad, good in [("torch.float16", "float16"), ("fp16", "float16"), ("half", "float16"), ("bf16", "bfloat16"),
                      ("torch.bfloat16", "bfloat16"), ("fp32", "float32"), ("BFLOAT16", "bfloat16")]:
        assert F.normalize_choice("--dtype", bad) == good
    assert F.normalize_choice("--dtype", "int8") is None
    assert F.normalize_choice("--kv-cache-dtype", "float8_e4m3fn") == "fp8_e4m3"
    assert F.normalize_choice("-q", "AWQ") == "awq"
    assert F.normalize_choice("--quantization", "compressed_tensors") == "compressed-tensors"
    assert F.normalize_choice("--distributed-executor-backend", "multiprocessing") == "mp"


def test_takes_value():
    for switch in ["--enforce-eager", "--trust-remote-code", "--no-enforce-eager", "--disable-log-stats",
                   "--enable-prefix-caching", "--disable-prefix-caching", "-ep", "--headless"]:
        assert not F.takes_value(switch), switch
    for valued in ["-tp", "--max-model-len", "--dtype", "--tensor_parallel_size", "--some-unknown-flag"]:
        assert F.takes_value(valued), valued


@pytest.mark.parametrize("argv,version,ok,msg", [
    (["vllm", "serve", "m", "--max-seq-len", "4096"], None, False,
     "vllm: error: unrecognized arguments: --max-seq-len 4096"),
    (["m", "--max-seq-len", "4096"], "0.6.3", True, ""),
    (["m", "--dtype", "torch.float16"], None, False,
     "vllm serve: error: argument --dtype: invalid choice: 'torch.float16' (choose from 'auto', 'bfloat16', "
     "'float', 'float16', 'float32', 'half')"),
    (["m", "-tp", "two"], None, False, "vllm serve: error: argument --tensor-parallel-size/-tp: invalid int value: 'two'"),
    (["m", "--port"], None, False, "vllm serve: error: argument --port: expected one argument"),
    (["m", "--enforce-eager=yes"], None, False,
     "vllm serve: error: argument --enforce-eager: ignored explicit argument 'yes'"),
    (["m", "--swap-space", "4"], "0.20.0", False, "vllm: error: unrecognized arguments: --swap-space 4"),
    (["m", "--max-model-len", "32k", "--kv-cache-memory-bytes", "1M"], None, True, ""),
    (["m", "--max-model-len", "32k"], "0.10.0", False,
     "vllm serve: error: argument --max-model-len: invalid int value: '32k'"),
    (["--model", "m", "--tensor-parallel-size", "2"], "0.4.0", True, ""),
    (["m", "--model", "m"], "0.4.0", False, "api_server.py: error: unrecognized arguments: m"),
    (["m", "-tp", "2", "--max_model_len=4096", "--gpu-mem", "0.8", "-O3", "--no-enforce-eager"], None, True, ""),
])
def test_accepts(argv, version, ok, msg):
    assert accepts(argv, version) == (ok, msg)


def test_accepts_ambiguous_prefix():
    ok, msg = accepts(["m", "--max", "4"])
    assert not ok and "ambiguous option: --max could match" in msg and "--max-model-len" in msg


def test_versions():
    assert parse_version("0.10.2") > parse_version("0.9.2")
    assert parse_version("0.4.0.post1") > parse_version("0.4.0")
    assert parse_version("0.11.1rc2") < parse_version("0.11.1")
    assert compare("0.5.2", "0.5.10") == -1
    assert F.at_least(None, "0.20.0")
