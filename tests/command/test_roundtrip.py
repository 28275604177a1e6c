"""Command.parse(s).render() == s for every launch shape, and the parsed fields are right."""
import pytest

from vllm_doctor.command import Command

SHAPES = {
    "serve": "vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 3 --max-model-len 8192",
    "serve_eq": "vllm serve /models/m --tensor-parallel-size=3 --dtype=bfloat16",
    "module": "python -m vllm.entrypoints.openai.api_server --model /models/m -tp 3 --port 8001",
    "module3": "python3 -u -m vllm.entrypoints.api_server --model /models/m --tensor_parallel_size 3",
    "env": "CUDA_VISIBLE_DEVICES=0,1 NCCL_P2P_DISABLE=1 vllm serve m -tp 2",
    "env_cmd": "env CUDA_VISIBLE_DEVICES=0,1 vllm serve m -tp 2 -pp 2 -q awq -dp 1",
    "continuation": "vllm serve Qwen/Qwen2-7B \\\n  --tensor-parallel-size 3 \\\n  --max_model_len 4096 \\\n  --trust-remote-code\n",
    "quoted": "vllm serve m --served-model-name \"my model\" --hf-overrides '{\"rope_theta\": 1000000}'",
    "pipe": "vllm serve m -tp 3 2>&1 | tee server.log",
    "docker": ("docker run --runtime nvidia --gpus all -v ~/.cache/huggingface:/root/.cache/huggingface "
               "--env \"HF_TOKEN=abc\" -p 8000:8000 --ipc=host vllm/vllm-openai:latest --model m -tp 3"),
    "sudo_docker": "sudo docker run -it --rm --gpus '\"device=0,1\"' vllm/vllm-openai:v0.9.0 m --tensor-parallel-size 2",
    "podman": "podman run --device nvidia.com/gpu=all -e VLLM_LOGGING_LEVEL=DEBUG vllm/vllm-openai m",
    "docker_serve": "docker run --gpus all --entrypoint vllm my/image:tag serve m --tensor-parallel-size 3",
    "docker_explicit": "docker run --gpus all nvcr.io/nvidia/pytorch:24.05 vllm serve m -tp 3",
    "compose_flow": 'command: ["--model", "m", "--tensor-parallel-size", "3"]',
    "compose_flow_ml": 'command: [\n    "--model", "m",\n    "--tensor-parallel-size", "3",\n  ]',
    "compose_block": "command:\n  - --model\n  - m\n  - --tensor-parallel-size=3\n",
    "compose_string": 'command: "--model m --tensor-parallel-size 3"',
    "compose_string_serve": "command: vllm serve m --tensor-parallel-size 3",
    "python": 'llm = LLM(model="m", tensor_parallel_size=3)',
    "python_ml": 'from vllm import LLM\nllm = LLM(\n    model="m",\n    tensor_parallel_size=3,\n)\n',
    "unknown": "./start_server.sh --tp 3",
}

EXPECT = {  # shape, model, tp as written
    "serve": ("serve", "meta-llama/Llama-3.1-8B-Instruct", "3"),
    "serve_eq": ("serve", "/models/m", "3"),
    "module": ("module", "/models/m", "3"),
    "module3": ("module", "/models/m", "3"),
    "env": ("serve", "m", "2"),
    "env_cmd": ("serve", "m", "2"),
    "continuation": ("serve", "Qwen/Qwen2-7B", "3"),
    "quoted": ("serve", "m", None),
    "pipe": ("serve", "m", "3"),
    "docker": ("docker", "m", "3"),
    "sudo_docker": ("docker", "m", "2"),
    "podman": ("docker", "m", None),
    "docker_serve": ("docker", "m", "3"),
    "docker_explicit": ("docker", "m", "3"),
    "compose_flow": ("compose", "m", "3"),
    "compose_flow_ml": ("compose", "m", "3"),
    "compose_block": ("compose", "m", "3"),
    "compose_string": ("compose", "m", "3"),
    "compose_string_serve": ("compose", "m", "3"),
    "python": ("python", "m", "3"),
    "python_ml": ("python", "m", "3"),
    "unknown": ("unknown", None, None),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_round_trip(name):
    text = SHAPES[name]
    cmd = Command.parse(text)
    assert cmd.render() == text
    assert cmd.apply([]).render() == text
    assert cmd.notes == []


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_parsed_fields(name):
    cmd = Command.parse(SHAPES[name])
    shape, model, tp = EXPECT[name]
    assert cmd.shape == shape
    assert cmd.model == model
    assert cmd.get("--tensor-parallel-size") == tp


def test_aliases_and_spellings_are_understood():
    cmd = Command.parse(SHAPES["env_cmd"])
    assert cmd.get("-tp") == cmd.get("--tensor_parallel_size") == "2"
    assert cmd.get("--pipeline-parallel-size") == "2"
    assert cmd.get("--quantization") == "awq"
    assert cmd.get("--data-parallel-size") == "1"
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_switches_quotes_and_docker_env():
    cont = Command.parse(SHAPES["continuation"])
    assert cont.get("--trust-remote-code") is True
    assert cont.get("--max-model-len") == "4096"
    assert cont.has("--trust-remote-code") and not cont.has("--enforce-eager")
    q = Command.parse(SHAPES["quoted"])
    assert q.get("--served-model-name") == "my model"
    assert q.get("--hf-overrides") == '{"rope_theta": 1000000}'
    d = Command.parse(SHAPES["docker"])
    assert d.env == {"HF_TOKEN": "abc"}
    assert d.docker_options()["--ipc"] == "host"
    assert d.argv() == ["--model", "m", "-tp", "3"]


def test_negated_switch_reads_false():
    cmd = Command.parse("vllm serve m --disable-prefix-caching --no-enforce-eager --disable-custom-all-reduce")
    assert cmd.get("--enable-prefix-caching") is False
    assert cmd.get("--enforce-eager") is False and not cmd.has("--enforce-eager")
    assert cmd.get("--disable-custom-all-reduce") is True


def test_glued_argument_is_split_and_reported():
    cmd = Command.parse('vllm serve m "--port 6379" -tp 2')
    assert cmd.get("--port") == "6379"
    assert cmd.render() == "vllm serve m --port 6379 -tp 2"
    assert any("--port 6379" in n and "split" in n for n in cmd.notes)
    listed = Command.parse('command: ["--model", "m", "--port 6379"]')
    assert listed.render() == 'command: ["--model", "m", "--port", "6379"]'
    assert listed.get("--port") == "6379" and listed.notes


def test_python_api_values():
    cmd = Command.parse('LLM("m", tensor_parallel_size=3, enforce_eager=True, dtype="half")')
    assert cmd.model == "m"
    assert cmd.get("-tp") == "3"
    assert cmd.get("--enforce-eager") is True
    assert cmd.get("--dtype") == "half"
