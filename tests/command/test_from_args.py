"""Rebuilding the command from what vLLM logged (dicts copied from tests/data/corpus-dev logs, vLLM 0.32)."""
from vllm_doctor.command import Command
from vllm_doctor.command.argcheck import accepts
from vllm_doctor.command.fromargs import parse_args_repr

# verbatim from 07-tp3-40heads.log / 18-max-model-len-512.log / 27-kv-bytes-too-small.log / 31-gpu-mem-util-0.99.log
LOGGED = {
    "{'model_tag': '/models/tiny40', 'model': '/models/tiny40', 'tensor_parallel_size': 3}":
        "vllm serve /models/tiny40 --tensor-parallel-size 3",
    "{'model_tag': '/models/tiny512', 'model': '/models/tiny512', 'max_model_len': 100000}":
        "vllm serve /models/tiny512 --max-model-len 100000",
    "{'model_tag': '/models/tiny40', 'model': '/models/tiny40', 'kv_cache_memory_bytes': 1048576}":
        "vllm serve /models/tiny40 --kv-cache-memory-bytes 1048576",
    "{'model_tag': '/models/tiny40', 'model': '/models/tiny40', 'gpu_memory_utilization': 0.99}":
        "vllm serve /models/tiny40 --gpu-memory-utilization 0.99",
    "{'model_tag': '/models/tinyremote', 'model': '/models/tinyremote'}": "vllm serve /models/tinyremote",
}


def test_non_default_args_from_corpus():
    for logged, expected in LOGGED.items():
        cmd = Command.from_args(parse_args_repr(logged), version="0.32.0")
        assert cmd.render() == expected
        assert accepts(cmd.argv(), "0.32.0") == (True, "")


def test_booleans_lists_dicts():
    cmd = Command.from_args({"model_tag": "Qwen/Qwen3-8B", "trust_remote_code": True, "enable_prefix_caching": False,
                             "hf_overrides": {"rope_theta": 1000000}, "served_model_name": ["a", "b"],
                             "cudagraph_capture_sizes": [1, 2, 4], "tensor_parallel_size": 2})
    assert cmd.render() == ("vllm serve Qwen/Qwen3-8B --trust-remote-code --disable-prefix-caching "
                            "--hf-overrides '{\"rope_theta\": 1000000}' --served-model-name a b "
                            "--cudagraph-capture-sizes 1 2 4 --tensor-parallel-size 2")
    assert cmd.get("--hf-overrides") == '{"rope_theta": 1000000}'
    assert accepts(cmd.argv()) == (True, "")


def test_namespace_keeps_only_user_values():
    ns = ("Namespace(subparser='serve', model_tag='mistralai/Mistral-7B-v0.1', config='', host=None, port=8000, "
          "uvicorn_log_level='info', allow_credentials=False, allowed_origins=['*'], api_key=None, "
          "model='mistralai/Mistral-7B-v0.1', tokenizer=None, trust_remote_code=False, dtype='auto', "
          "max_model_len=4096, tensor_parallel_size=2, pipeline_parallel_size=1, block_size=16, seed=0, "
          "swap_space=4, gpu_memory_utilization=0.9, enforce_eager=True, quantization=None, "
          "dispatch_function=<function serve at 0x7f2a5c1e3d00>)")
    cmd = Command.from_args(ns, version="0.6.3")
    assert cmd.render() == "vllm serve mistralai/Mistral-7B-v0.1 --max-model-len 4096 --tensor-parallel-size 2 --enforce-eager"
    assert accepts(cmd.argv(), "0.6.3") == (True, "")


def test_old_versions_use_the_module_launcher():
    cmd = Command.from_args({"model": "facebook/opt-125m", "tensor_parallel_size": 2}, version="0.4.2")
    assert cmd.render() == "python -m vllm.entrypoints.openai.api_server --model facebook/opt-125m --tensor-parallel-size 2"
    assert cmd.shape == "module" and cmd.model == "facebook/opt-125m"
    assert accepts(cmd.argv(), "0.4.2") == (True, "")


def test_parse_args_repr_tolerates_non_literals():
    d = parse_args_repr("Namespace(a=1, b='x,y', c=[1, 2], f=<function f at 0x1>, d={'k': (1, 2)})")
    assert d == {"a": 1, "b": "x,y", "c": [1, 2], "f": "<function f at 0x1>", "d": {"k": (1, 2)}}
