"""DropLauncher and SetModel in every launch shape: the user's layout kept, the result accepted by argparse."""
import pytest

from vllm_doctor.command import Command, DropLauncher, Edit, SetFlag, SetModel
from vllm_doctor.command.argcheck import accepts


def fix(text, *edits):
    return Command.parse(text).apply(edits)


def test_both_are_edits_and_constructible_the_way_remedies_build_them():
    from vllm_doctor.command import edits as E
    assert getattr(E, "DropLauncher")() == DropLauncher()
    assert getattr(E, "SetModel")("m") == SetModel("m")
    assert isinstance(DropLauncher(), Edit) and isinstance(SetModel("m"), Edit)


# ---------------------------------------------------------------- DropLauncher

DOCKER_OPTS = ("docker run --name glm --rm --gpus all --network=host --ipc=host "
               "-v /data/models/GLM:/models/GLM vllm/vllm-openai:v0.17.1")


def test_drop_vllm_serve_after_image():
    new = fix(f"{DOCKER_OPTS} vllm serve /models/GLM --served-model-name glm --port 9527", DropLauncher())
    assert new.render() == f"{DOCKER_OPTS} /models/GLM --served-model-name glm --port 9527"
    assert new.shape == "docker" and new.model == "/models/GLM" and new.notes == []
    assert new.docker_options() == Command.parse(f"{DOCKER_OPTS} m").docker_options()
    assert accepts(new.argv(), "0.17.1") == (True, "")


def test_drop_api_server_module_after_old_image_keeps_model_flag():
    opts = "docker run --runtime nvidia --gpus all -p 8000:8000 --ipc=host vllm/vllm-openai:v0.6.3"
    new = fix(f"{opts} python3 -m vllm.entrypoints.openai.api_server --model mistralai/M-7B --max-model-len 16384",
              DropLauncher())
    assert new.render() == f"{opts} --model mistralai/M-7B --max-model-len 16384"
    assert new.get("--model") == "mistralai/M-7B"
    assert accepts(new.argv(), "0.6.3") == (True, "")


def test_drop_python_flags_and_cli_main_launcher():
    assert fix("docker run vllm/vllm-openai:v0.9.0 python3 -u -m vllm.entrypoints.openai.api_server --model m",
               DropLauncher()).render() == "docker run vllm/vllm-openai:v0.9.0 --model m"
    assert fix("docker run vllm/vllm-openai:v0.9.0 python3 -m vllm.entrypoints.cli.main serve m -tp 2",
               DropLauncher()).render() == "docker run vllm/vllm-openai:v0.9.0 m -tp 2"


def test_drop_bare_serve_after_image():
    assert fix("docker run --gpus all vllm/vllm-openai:latest serve m --port 1",
               DropLauncher()).render() == "docker run --gpus all vllm/vllm-openai:latest m --port 1"


def test_drop_keeps_continuations():
    text = "docker run --gpus all \\\n  vllm/vllm-openai:v0.8.5 \\\n  vllm serve Qwen/Q \\\n  --port 8001\n"
    assert fix(text, DropLauncher()).render() == (
        "docker run --gpus all \\\n  vllm/vllm-openai:v0.8.5 \\\n  Qwen/Q \\\n  --port 8001\n")
    text = "docker run --gpus all vllm/vllm-openai:v0.8.5 vllm serve \\\n    Qwen/Q \\\n    --port 8001\n"
    assert fix(text, DropLauncher()).render() == (
        "docker run --gpus all vllm/vllm-openai:v0.8.5 \\\n    Qwen/Q \\\n    --port 8001\n")


def test_drop_with_env_prefix_and_sudo():
    text = "sudo docker run -e HF_TOKEN=x vllm/vllm-openai:v0.10.0 vllm serve m --max-model-len 4096 2>&1 | tee log"
    new = fix(text, DropLauncher())
    assert new.render() == "sudo docker run -e HF_TOKEN=x vllm/vllm-openai:v0.10.0 m --max-model-len 4096 2>&1 | tee log"
    assert new.env == {"HF_TOKEN": "x"}


def test_drop_then_other_edits_land_after_the_image():
    new = fix("docker run vllm/vllm-openai:v0.17.1 vllm serve m --port 1",
              DropLauncher(), SetFlag("--max-model-len", "4096"))
    assert new.render() == "docker run vllm/vllm-openai:v0.17.1 m --port 1 --max-model-len 4096"


def test_drop_is_idempotent_and_noop_without_launcher():
    text = "docker run --gpus all vllm/vllm-openai:v0.17.1 m --port 1"
    assert fix(text, DropLauncher()).render() == text
    assert fix(text, DropLauncher(), DropLauncher()).render() == text


@pytest.mark.parametrize("text, expected", [
    ('command: ["vllm", "serve", "m", "--port", "8000"]', 'command: ["m", "--port", "8000"]'),
    ("command: ['python3', '-m', 'vllm.entrypoints.openai.api_server', '--model', 'm']",
     "command: ['--model', 'm']"),
    ("command:\n  - vllm\n  - serve\n  - m\n  - --port\n  - \"8000\"\n", "command:\n  - m\n  - --port\n  - \"8000\"\n"),
    ("command:\n  - python3\n  - -m\n  - vllm.entrypoints.openai.api_server\n  - --model\n  - m\n",
     "command:\n  - --model\n  - m\n"),
    ("command: vllm serve m --port 8000", "command: m --port 8000"),
    ('command: "vllm serve m --port 8000"', 'command: "m --port 8000"'),
    ('command: [\n    "vllm", "serve",\n    "m",\n    "--port", "8000",\n  ]',
     'command: [\n    "m",\n    "--port", "8000",\n  ]'),
])
def test_drop_in_compose_command(text, expected):
    new = fix(text, DropLauncher())
    assert new.render() == expected
    assert new.shape == "compose" and new.model == "m"


@pytest.mark.parametrize("text", [
    "vllm serve m --port 1",
    "python -m vllm.entrypoints.openai.api_server --model m",
    "CUDA_VISIBLE_DEVICES=0 vllm serve m",
    "./start.sh --tp 3",
    'llm = LLM(model="m")',
])
def test_drop_outside_a_container_is_a_noted_noop(text):
    new = fix(text, DropLauncher())
    assert new.render() == text
    assert new.notes and any("launcher" in n for n in new.notes)


def test_drop_keeps_launcher_when_entrypoint_is_overridden():
    text = "docker run --entrypoint vllm my/image:tag serve m -tp 2"
    new = fix(text, DropLauncher())
    assert new.render() == text
    assert any("--entrypoint vllm" in n for n in new.notes)


def test_drop_after_non_vllm_image_is_noted():
    new = fix("docker run myorg/llm-server:1 vllm serve m", DropLauncher())
    assert new.render() == "docker run myorg/llm-server:1 m"
    assert any("myorg/llm-server:1" in n for n in new.notes)


# ---------------------------------------------------------------- SetModel

@pytest.mark.parametrize("text, expected", [
    ("vllm serve --model /models/llama --served-model-name l3 --port 8002",
     "vllm serve /models/llama --served-model-name l3 --port 8002"),
    ("vllm serve --model=/models/llama --port 8002", "vllm serve /models/llama --port 8002"),
    ("vllm serve --port 8002 --model /models/llama", "vllm serve /models/llama --port 8002"),
    ("vllm serve --port 8002", "vllm serve /models/llama --port 8002"),
    ("vllm serve", "vllm serve /models/llama"),
    ("vllm serve old/m --model x --port 8002", "vllm serve /models/llama --port 8002"),
    ("vllm serve \\\n  --model x \\\n  --port 8002\n", "vllm serve \\\n  /models/llama \\\n  --port 8002\n"),
    ("vllm serve \\\n  --port 8002 \\\n  --model x\n", "vllm serve /models/llama \\\n  --port 8002\n"),
    ("CUDA_VISIBLE_DEVICES=0 vllm serve --model x -tp 1", "CUDA_VISIBLE_DEVICES=0 vllm serve /models/llama -tp 1"),
    ("python -m vllm.entrypoints.cli.main serve --model x", "python -m vllm.entrypoints.cli.main serve /models/llama"),
])
def test_set_model_positional_in_vllm_serve(text, expected):
    new = fix(text, SetModel("/models/llama"))
    assert new.render() == expected
    assert new.model == "/models/llama"
    assert "--model" not in new.argv()
    assert accepts(new.argv(), "0.17.1") == (True, "")


def test_set_model_quotes_like_the_user():
    assert fix("vllm serve --model 'a b' --port 1", SetModel("c d")).render() == "vllm serve 'c d' --port 1"
    assert fix("vllm serve --port 1", SetModel("my model")).render() == "vllm serve 'my model' --port 1"


@pytest.mark.parametrize("text, expected", [
    ("python -m vllm.entrypoints.openai.api_server --model x --port 1",
     "python -m vllm.entrypoints.openai.api_server --model M --port 1"),
    ("python -m vllm.entrypoints.openai.api_server --model=x --port 1",
     "python -m vllm.entrypoints.openai.api_server --model=M --port 1"),
    ("python3 -m vllm.entrypoints.openai.api_server --port 1",
     "python3 -m vllm.entrypoints.openai.api_server --model M --port 1"),
    ("python3 -m vllm.entrypoints.openai.api_server",
     "python3 -m vllm.entrypoints.openai.api_server --model M"),
    ("python -m vllm.entrypoints.openai.api_server x --port 1",
     "python -m vllm.entrypoints.openai.api_server --model M --port 1"),
])
def test_set_model_flag_in_api_server_module(text, expected):
    new = fix(text, SetModel("M"))
    assert new.render() == expected
    assert new.get("--model") == "M"
    assert accepts(new.argv(), "0.4.0") == (True, "")


@pytest.mark.parametrize("text, expected", [
    # new images (`vllm serve` entrypoint): the model is the first argument after the image
    ("docker run --gpus all vllm/vllm-openai:v0.17.1 --model x --served-model-name s",
     "docker run --gpus all vllm/vllm-openai:v0.17.1 M --served-model-name s"),
    ("docker run --gpus all vllm/vllm-openai:latest --port 1", "docker run --gpus all vllm/vllm-openai:latest M --port 1"),
    ("docker run --gpus all vllm/vllm-openai:v0.9.0 x -tp 2", "docker run --gpus all vllm/vllm-openai:v0.9.0 M -tp 2"),
    ("docker run vllm/vllm-openai:v0.17.1 vllm serve --model x", "docker run vllm/vllm-openai:v0.17.1 vllm serve M"),
    ("docker run --entrypoint vllm my/image:1 serve --model x", "docker run --entrypoint vllm my/image:1 serve M"),
    # images older than `vllm serve` whose args already use --model keep it
    ("docker run --gpus all vllm/vllm-openai:v0.4.3 --model x --port 1",
     "docker run --gpus all vllm/vllm-openai:v0.4.3 --model M --port 1"),
    ("docker run vllm/vllm-openai:v0.6.3 python3 -m vllm.entrypoints.openai.api_server --model x",
     "docker run vllm/vllm-openai:v0.6.3 python3 -m vllm.entrypoints.openai.api_server --model M"),
])
def test_set_model_in_docker(text, expected):
    new = fix(text, SetModel("M"))
    assert new.render() == expected
    assert new.model == "M"


def test_set_model_docker_with_continuations_and_options_untouched():
    text = ("docker run --runtime nvidia --gpus all \\\n    -v ~/.cache/huggingface:/root/.cache/huggingface \\\n"
            "    vllm/vllm-openai:v0.10.1 \\\n    --model x \\\n    --port 8000\n")
    new = fix(text, SetModel("Qwen/Q"))
    assert new.render() == text.replace("--model x", "Qwen/Q")
    assert new.docker_options() == Command.parse(text).docker_options()


def test_drop_launcher_then_set_model():
    new = fix("docker run vllm/vllm-openai:v0.17.1 vllm serve --model x --served-model-name s",
              DropLauncher(), SetModel("x"))
    assert new.render() == "docker run vllm/vllm-openai:v0.17.1 x --served-model-name s"


@pytest.mark.parametrize("text, expected", [
    ('command: ["--model", "x", "--port", "1"]', 'command: ["M", "--port", "1"]'),
    ('command: ["--port", "1"]', 'command: ["M", "--port", "1"]'),
    ("command:\n  - --port\n  - '1'\n  - --model\n  - x\n", "command:\n  - 'M'\n  - --port\n  - '1'\n"),
    ("command:\n  - --model=x\n  - --port=1\n", "command:\n  - M\n  - --port=1\n"),
    ("command: vllm serve --model x --port 1", "command: vllm serve M --port 1"),
    ("command: ['python3', '-m', 'vllm.entrypoints.openai.api_server', '--port', '1']",
     "command: ['python3', '-m', 'vllm.entrypoints.openai.api_server', '--model', 'M', '--port', '1']"),
])
def test_set_model_in_compose(text, expected):
    new = fix(text, SetModel("M"))
    assert new.render() == expected
    assert new.model == "M"


@pytest.mark.parametrize("text, expected", [
    ('llm = LLM(model="x", tensor_parallel_size=2)', 'llm = LLM(model="M", tensor_parallel_size=2)'),
    ("llm = LLM('x', tensor_parallel_size=2)", "llm = LLM('M', tensor_parallel_size=2)"),
    ('llm = LLM(tensor_parallel_size=2)', 'llm = LLM(tensor_parallel_size=2, model="M")'),
    ('llm = LLM(\n    model="x",\n    tensor_parallel_size=2,\n)\n', 'llm = LLM(\n    model="M",\n    tensor_parallel_size=2,\n)\n'),
])
def test_set_model_in_python_api(text, expected):
    new = fix(text, SetModel("M"))
    assert new.render() == expected
    assert new.shape == "python" and new.model == "M"


def test_set_model_numeric_name_stays_a_string_in_python():
    assert fix("llm = LLM(tensor_parallel_size=2)", SetModel("7")).render() == 'llm = LLM(tensor_parallel_size=2, model="7")'


def test_set_model_unknown_shape_sets_the_flag():
    assert fix("./start.sh --tp 3", SetModel("M")).render() == "./start.sh --tp 3 --model M"


def test_originals_are_not_mutated():
    cmd = Command.parse("docker run vllm/vllm-openai:v0.17.1 vllm serve --model x")
    cmd.apply([DropLauncher(), SetModel("y")])
    assert cmd.render() == "docker run vllm/vllm-openai:v0.17.1 vllm serve --model x"
