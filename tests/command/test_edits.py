"""Edits land in the user's own shape and style; corrected commands pass the argparse oracle."""
from vllm_doctor.command import Command, DockerOption, RemoveFlag, SetEnv, SetFlag
from vllm_doctor.command.argcheck import accepts

TP2 = [SetFlag("--tensor-parallel-size", "2")]


def fix(text, edits=TP2):
    return Command.parse(text).apply(edits)


def test_tp_in_vllm_serve():
    new = fix("vllm serve /models/tiny40 --tensor-parallel-size 3")
    assert new.render() == "vllm serve /models/tiny40 --tensor-parallel-size 2"
    assert accepts(new.argv()) == (True, "")


def test_tp_in_python_module_form():
    new = fix("python -m vllm.entrypoints.openai.api_server --model m --tensor-parallel-size 3", TP2)
    assert new.render() == "python -m vllm.entrypoints.openai.api_server --model m --tensor-parallel-size 2"
    assert accepts(new.argv(), "0.4.0") == (True, "")


def test_alias_and_equals_style_kept():
    assert fix("vllm serve m -tp 3").render() == "vllm serve m -tp 2"
    assert fix("vllm serve m --tensor-parallel-size=3").render() == "vllm serve m --tensor-parallel-size=2"
    assert fix("vllm serve m --tensor_parallel_size 3").render() == "vllm serve m --tensor_parallel_size 2"


def test_every_spelling_replaced_once():
    new = fix("vllm serve m -tp 4 --max-model-len 4096 --tensor-parallel-size=3")
    assert new.render() == "vllm serve m -tp 2 --max-model-len 4096"
    assert any("--tensor-parallel-size=3" in n for n in new.notes)


def test_new_flag_follows_style():
    assert fix("vllm serve m --dtype=half").render() == "vllm serve m --dtype=half --tensor-parallel-size=2"
    assert fix("vllm serve m --max_model_len 4096").render() == "vllm serve m --max_model_len 4096 --tensor_parallel_size 2"


def test_continuation_kept_one_flag_per_line():
    text = "vllm serve m \\\n    --max-model-len 4096 \\\n    --gpu-memory-utilization 0.95\n"
    new = fix(text, [SetFlag("--enforce-eager"), SetFlag("--gpu-memory-utilization", "0.85")])
    assert new.render() == ("vllm serve m \\\n    --max-model-len 4096 \\\n    --gpu-memory-utilization 0.85"
                            " \\\n    --enforce-eager\n")


def test_remove_flag_and_value():
    text = "vllm serve m \\\n  --max-seq-len 4096 \\\n  -tp 2"
    assert fix(text, [RemoveFlag("--max-seq-len")]).render() == "vllm serve m \\\n  -tp 2"
    new = fix("vllm serve m --swap-space 16 --enforce-eager", [RemoveFlag("--swap-space")])
    assert new.render() == "vllm serve m --enforce-eager"


def test_switch_replaces_its_negation():
    new = fix("vllm serve m --no-enforce-eager", [SetFlag("--enforce-eager")])
    assert new.render() == "vllm serve m --enforce-eager"


def test_quoted_value_keeps_quote_style():
    new = fix("vllm serve m --tokenizer 'a b'", [SetFlag("--tokenizer", "c d")])
    assert new.render() == "vllm serve m --tokenizer 'c d'"
    new = fix("vllm serve m", [SetFlag("--hf-overrides", '{"rope_theta": 1}')])
    assert new.render() == "vllm serve m --hf-overrides '{\"rope_theta\": 1}'"


def test_env_prefix_added_after_existing_ones():
    new = fix("CUDA_VISIBLE_DEVICES=0,1 vllm serve m -tp 2", [SetEnv("NCCL_P2P_DISABLE", "1")])
    assert new.render() == "CUDA_VISIBLE_DEVICES=0,1 NCCL_P2P_DISABLE=1 vllm serve m -tp 2"
    assert new.env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1"}
    assert fix("vllm serve m", [SetEnv("A", "1")]).render() == "A=1 vllm serve m"
    assert fix("env A=1 vllm serve m", [SetEnv("A", "2")]).render() == "env A=2 vllm serve m"
    assert fix("sudo vllm serve m", [SetEnv("A", "x y")]).render() == "sudo A='x y' vllm serve m"


def test_docker_options_and_env_on_docker_side():
    text = ("docker run --gpus all \\\n  -e HF_TOKEN=abc \\\n  -p 8000:8000 \\\n  vllm/vllm-openai:latest \\\n"
            "  --model m \\\n  --tensor-parallel-size 3")
    new = fix(text, [DockerOption("--shm-size", "16g"), SetEnv("NCCL_P2P_DISABLE", "1"), *TP2])
    assert new.render() == ("docker run --gpus all \\\n  -e HF_TOKEN=abc \\\n  -e NCCL_P2P_DISABLE=1 \\\n"
                            "  -p 8000:8000 \\\n  --shm-size 16g \\\n  vllm/vllm-openai:latest \\\n"
                            "  --model m \\\n  --tensor-parallel-size 2")
    assert new.env == {"HF_TOKEN": "abc", "NCCL_P2P_DISABLE": "1"}
    assert ("docker", None, "--shm-size 16g") in Command.parse(text).diff(new)


def test_docker_option_replaced_in_place():
    new = fix("docker run --ipc=private --shm-size 1g img m", [DockerOption("--ipc", "host"),
                                                                 DockerOption("--shm-size", "8g")])
    assert new.render() == "docker run --ipc=host --shm-size 8g img m"


def test_docker_option_on_plain_command_is_a_note():
    new = fix("vllm serve m", [DockerOption("--shm-size", "16g")])
    assert new.render() == "vllm serve m"
    assert any("--shm-size" in n for n in new.notes)


def test_compose_lists():
    flow = fix('command: ["--model", "m", "--tensor-parallel-size", "3"]', TP2 + [SetFlag("--enforce-eager")])
    assert flow.render() == 'command: ["--model", "m", "--tensor-parallel-size", "2", "--enforce-eager"]'
    block = fix("command:\n  - --model\n  - m\n  - -tp\n  - '3'\n", TP2 + [SetFlag("--max-model-len", "4096")])
    assert block.render() == "command:\n  - --model\n  - m\n  - -tp\n  - '2'\n  - --max-model-len\n  - '4096'\n"
    plain = fix("command:\n  - --model\n  - m\n", [SetFlag("--max-model-len", "4096")])
    assert plain.render() == 'command:\n  - --model\n  - m\n  - --max-model-len\n  - "4096"\n'   # YAML would read 4096 as int
    env = fix("command: [\"--model\", \"m\"]", [SetEnv("NCCL_SHM_DISABLE", "1"), DockerOption("--shm-size", "16g")])
    assert env.render() == 'command: ["--model", "m"]'
    assert any("environment" in n for n in env.notes) and any("shm_size: 16g" in n for n in env.notes)


def test_python_api_kwargs():
    new = fix('llm = LLM(model="m", tensor_parallel_size=3)', TP2 + [SetFlag("--enforce-eager")])
    assert new.render() == 'llm = LLM(model="m", tensor_parallel_size=2, enforce_eager=True)'
    ml = fix('llm = LLM(\n    model="m",\n    tensor_parallel_size=3,\n)',
             [SetFlag("--max-model-len", "4096"), SetFlag("--dtype", "float16"), RemoveFlag("-tp")])
    assert ml.render() == 'llm = LLM(\n    model="m",\n    max_model_len=4096,\n    dtype="float16",\n)'
    env = fix('llm = LLM(model="m")', [SetEnv("NCCL_P2P_DISABLE", "1")])
    assert env.render() == 'import os\nos.environ["NCCL_P2P_DISABLE"] = "1"\nllm = LLM(model="m")'
    assert env.notes
    neg = fix('LLM(model="m")', [SetFlag("--disable-prefix-caching"), SetFlag("--disable-custom-all-reduce")])
    assert neg.render() == 'LLM(model="m", enable_prefix_caching=False, disable_custom_all_reduce=True)'


def test_unknown_shape_appends_at_end():
    new = fix("./serve.sh --tp 3", [SetFlag("--max-model-len", "4096")])
    assert new.render() == "./serve.sh --tp 3 --max-model-len 4096"


def test_pipe_tail_kept_after_new_flags():
    new = fix("vllm serve m -tp 3 2>&1 | tee log.txt")
    assert new.render() == "vllm serve m -tp 2 2>&1 | tee log.txt"


def test_diff_shows_old_and_new():
    old = Command.parse("vllm serve m -tp 3 --swap-space 4")
    new = old.apply([SetFlag("-tp", "2"), RemoveFlag("--swap-space"), SetEnv("A", "1")])
    assert old.diff(new) == [("flag", "-tp 3", "-tp 2"), ("flag", "--swap-space 4", None), ("env", None, "A=1")]
    assert old.render() == "vllm serve m -tp 3 --swap-space 4"   # apply() never mutates


def test_model_edit_replaces_positional():
    new = fix("vllm serve old/model -tp 2", [SetFlag("--model", "new/model")])
    assert new.render() == "vllm serve new/model -tp 2"


def test_docker_values_and_image_read_the_container_options():
    cmd = Command.parse("docker run --gpus all -v /data:/models --volume=/hf:/root/.cache:ro "
                        "--device nvidia.com/gpu=all vllm/vllm-openai:v0.9.2 --model m")
    assert cmd.docker_values("-v") == cmd.docker_values("--volume") == ["/data:/models", "/hf:/root/.cache:ro"]
    assert cmd.docker_values("--device") == ["nvidia.com/gpu=all"] and cmd.docker_values("--ipc") == []
    assert cmd.docker_options()["--volume"] == "/hf:/root/.cache:ro"      # the dict keeps the last one only
    assert cmd.image == "vllm/vllm-openai:v0.9.2"
    plain = Command.parse("CUDA_VISIBLE_DEVICES=1 vllm serve m -v")
    assert plain.docker_values("-v") == [] and plain.image is None
