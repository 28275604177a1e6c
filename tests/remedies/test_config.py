"""Config/CLI/model remedies: the corrected command, and that vLLM's parser at the log's version takes it."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vllm_doctor.command import Command
from vllm_doctor.command.argcheck import accepts
from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.remedies import config as C
from vllm_doctor.remedies import model, ports

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx_for(remedy_context):
    """ctx_for(rule_id, text, command, facts=None, version=None): the engine's context for `text`'s lines (the
    remedy_context fixture, tests/remedies/conftest.py), the vLLM version given as the log's banner would."""
    def build(rule_id: str, text: str, command: str | None, facts: dict | None = None, version=None):
        given = dict(facts or {}, **({"vllm.version": version} if version else {}))
        return remedy_context(text, facts=given, command=command, rule=rule_id)
    return build


def fixed(ctx, fix) -> Command:
    return ctx.command.apply(fix.edits)


def assert_accepted(cmd: Command, version):
    ok, why = accepts(cmd.argv(), version)
    assert ok, f"{cmd.render()!r} rejected at {version}: {why}"


# ---------------------------------------------------------------- cli-unknown-arg

def test_max_seq_len_becomes_max_model_len_keeping_value(ctx_for):
    ctx = ctx_for("cli-unknown-arg", "vllm: error: unrecognized arguments: --max-seq-len 4096",
                  "vllm serve /models/tiny40 --max-seq-len 4096", version="0.32.0")
    fix = C.fix_unknown_arg(ctx)
    assert fix.summary.startswith("Use --max-model-len 4096 instead of --max-seq-len")
    assert any("0.4.3..0.10.2" in n and "--max-seq-len-to-capture" in n for n in fix.notes)
    new = fixed(ctx, fix)
    assert new.render() == "vllm serve /models/tiny40 --max-model-len 4096"
    assert_accepted(new, "0.32.0")


def test_removed_flag_is_dropped_with_its_value_docker_shape_kept(ctx_for):
    cmd = ("docker run --gpus all --ipc=host vllm/vllm-openai:v0.20.1 Qwen/Qwen3-8B "
           "--tensor-parallel-size 2 --swap-space 16")
    ctx = ctx_for("cli-unknown-arg", "vllm: error: unrecognized arguments: --swap-space 16", cmd)
    assert ctx.launch_version == "0.20.1"       # from the image tag: argparse fails before the banner
    fix = C.fix_unknown_arg(ctx)
    assert "--swap-space" in fix.summary and "0.18.0" in fix.summary
    new = fixed(ctx, fix)
    assert "--swap-space" not in new.render()
    assert new.render().startswith("docker run --gpus all --ipc=host vllm/vllm-openai:v0.20.1 Qwen/Qwen3-8B")
    assert_accepted(new, "0.20.1")


def test_renamed_flag_takes_its_fixed_value(ctx_for):
    cmd = ("docker run --gpus all vllm/vllm-openai:v0.7.3 --model meta-llama/Llama-3.1-70B-Instruct "
           "--tensor-parallel-size 4 --worker-use-ray")
    ctx = ctx_for("cli-unknown-arg", "api_server.py: error: unrecognized arguments: --worker-use-ray", cmd)
    fix = C.fix_unknown_arg(ctx)
    assert fix.summary == "Use --distributed-executor-backend ray instead of --worker-use-ray"
    new = fixed(ctx, fix)
    assert "--distributed-executor-backend ray" in new.render() and "--worker-use-ray" not in new.render()
    assert_accepted(new, "0.7.3")


def test_flag_only_in_newer_release_is_removed_with_upgrade_alternative(ctx_for):
    cmd = "docker run --gpus all vllm/vllm-openai:v0.9.2 Qwen/Qwen2.5-14B-Instruct --async-scheduling"
    ctx = ctx_for("cli-unknown-arg", "vllm: error: unrecognized arguments: --async-scheduling", cmd)
    fix = C.fix_unknown_arg(ctx)
    assert "0.10.0" in fix.summary
    assert any("0.10.0" in a.summary for a in fix.alternatives)
    new = fixed(ctx, fix)
    assert "--async-scheduling" not in new.render()
    assert_accepted(new, "0.9.2")


def test_task_becomes_runner_and_convert(ctx_for):
    text = ("vllm: error: unrecognized arguments: --task embed\n"
            "Hint: --task is not a vllm serve option. For embedding, reranking, or reward models, use --runner "
            "pooling.")
    ctx = ctx_for("cli-unknown-arg", text, "vllm serve BAAI/bge-m3 --task embed --port 8080", version="0.33.0")
    fix = C.fix_unknown_arg(ctx)
    assert "--runner pooling --convert embed" in fix.summary
    new = fixed(ctx, fix)
    assert new.render() == "vllm serve BAAI/bge-m3 --port 8080 --runner pooling --convert embed"
    assert_accepted(new, "0.33.0")


def test_unsplit_argv_is_reported_and_command_is_split(ctx_for):
    ctx = ctx_for("cli-unknown-arg", "vllm: error: unrecognized arguments: --host 127.0.0.1 --port 6379",
                  'vllm serve /m/llama "--host 127.0.0.1" "--port 6379"', version="0.6.1")
    fix = C.fix_unknown_arg(ctx)
    assert "--port 6379" in fix.summary and "--host 127.0.0.1" in fix.summary
    new = fixed(ctx, fix)
    assert new.render() == "vllm serve /m/llama --host 127.0.0.1 --port 6379"
    assert_accepted(new, "0.6.1")


def test_known_flags_echoed_without_a_command_mean_glued_argv(ctx_for):
    ctx = ctx_for("cli-unknown-arg", "api_server.py: error: unrecognized arguments: --dtype auto --max-model-len 8192",
                  None, version="0.10.0")
    fix = C.fix_unknown_arg(ctx)
    assert "--dtype auto as separate arguments" in fix.summary
    assert "--max-model-len 8192 as separate arguments" in fix.summary


def _usage_then_error(listed: list[str], error: str) -> list[str]:
    """argparse's usage block as it wraps (real shape: logs_corpus/real/config/n807.log), then its error line."""
    return (["usage: api_server.py [-h] [--host HOST] [--port PORT]"]
            + [f"                     [{flag} X]" for flag in listed] + [error])


USAGE_0_9 = ["--uvicorn-log-level", "--allowed-origins", "--api-key", "--lora-modules", "--chat-template",
             "--ssl-keyfile", "--tokenizer", "--dtype", "--max-model-len", "--enable-prefix-caching",
             "--max-num-seqs"]


def test_a_flag_the_printed_usage_lacks_is_the_installs_age_not_glued_argv(ctx_for):
    lines = _usage_then_error(USAGE_0_9, "api_server.py: error: unrecognized arguments: --attention-backend "
                                         "FLASHINFER --max-num-sequences 8")
    fix = C.fix_unknown_arg(ctx_for("cli-unknown-arg", lines, None))
    assert "installed vLLM has no --attention-backend" in fix.summary
    assert "separate arguments" not in fix.summary
    assert SetEnv("VLLM_ATTENTION_BACKEND", "FLASHINFER") in fix.edits
    # did-you-mean reads the installed parser's list: --max-num-seqs is in it
    assert "Use --max-num-seqs 8 instead of --max-num-sequences" in fix.summary
    # a flag the usage does list was glued to its value, as before
    glued = C.fix_unknown_arg(ctx_for("cli-unknown-arg", _usage_then_error(
        USAGE_0_9, "api_server.py: error: unrecognized arguments: --dtype auto"), None))
    assert "--dtype auto as separate arguments" in glued.summary


def test_docker_duplicated_launcher_is_explained(ctx_for):
    cmd = ("docker run --gpus all --ipc=host vllm/vllm-openai:v0.17.1 vllm serve /models/GLM "
           "--port 9527")
    ctx = ctx_for("cli-unknown-arg", "vllm: error: unrecognized arguments: serve /models/GLM", cmd)
    fix = C.fix_unknown_arg(ctx)
    assert "entrypoint already runs the server" in fix.summary
    assert "serve" in fix.summary
    # no flag edits: the flags themselves were fine
    assert not any(isinstance(e, SetFlag) for e in fix.edits)


def test_model_positional_error(ctx_for):
    ctx = ctx_for("cli-unknown-arg",
                  "ValueError: `model` should be provided as the first positional argument when using `vllm serve`.",
                  "vllm serve --model /models/llama --served-model-name l3 --port 8002")
    fix = C.fix_unknown_arg(ctx)
    assert "vllm serve /models/llama" in fix.summary


# ---------------------------------------------------------------- cli-invalid-choice

@pytest.mark.parametrize("value,expected", [("torch.float16", "float16"), ("bf16", "bfloat16"), ("fp16", "float16")])
def test_dtype_is_normalised(value, expected, ctx_for):
    text = (f"vllm serve: error: argument --dtype: invalid choice: '{value}' (choose from 'auto', 'bfloat16', "
            "'float', 'float16', 'float32', 'half')")
    ctx = ctx_for("cli-invalid-choice", text, f"vllm serve /models/tiny40 --dtype {value}", version="0.32.0")
    fix = C.fix_invalid_choice(ctx)
    assert f"--dtype {expected}" in fix.summary
    new = fixed(ctx, fix)
    assert new.render() == f"vllm serve /models/tiny40 --dtype {expected}"
    assert_accepted(new, "0.32.0")


def test_unquoted_choices_python_3_12_8(ctx_for):
    text = ("vllm serve: error: argument --dtype: invalid choice: 'bf16' (choose from auto, bfloat16, float, "
            "float16, float32, half)")
    ctx = ctx_for("cli-invalid-choice", text, "vllm serve g/gemma --dtype bf16", version="0.33.0")
    assert fixed(ctx, C.fix_invalid_choice(ctx)).get("--dtype") == "bfloat16"


def test_invalid_int_word(ctx_for):
    text = "api_server.py: error: argument --tensor-parallel-size/-tp: invalid int value: 'two'"
    cmd = "python -m vllm.entrypoints.openai.api_server --model Qwen/Q --tensor-parallel-size two"
    ctx = ctx_for("cli-invalid-choice", text, cmd, version="0.5.1")
    fix = C.fix_invalid_choice(ctx)
    assert fix.summary.startswith("Use --tensor-parallel-size 2")
    new = fixed(ctx, fix)
    assert new.get("--tensor-parallel-size") == "2"
    assert_accepted(new, "0.5.1")


def test_invalid_float_percent(ctx_for):
    text = "vllm serve: error: argument --gpu-memory-utilization: invalid float value: '90%'"
    ctx = ctx_for("cli-invalid-choice", text, "vllm serve m/p --gpu-memory-utilization 90%", version="0.6.3")
    new = fixed(ctx, C.fix_invalid_choice(ctx))
    assert new.get("--gpu-memory-utilization") == "0.9"
    assert_accepted(new, "0.6.3")


def test_pydantic_literal_in_script_names_llm_keyword_and_does_not_edit_the_script(ctx_for):
    """The remedy asks for the flag; remedies/shape.py never appends it to `python offline_batch.py`."""
    from vllm_doctor.remedies.shape import present

    text = ("  Input should be 'auto', 'half', 'float16', 'bfloat16', 'float' or 'float32' "
            "[type=literal_error, input_value='fp16', input_type=str]")
    ctx = ctx_for("cli-invalid-choice", text, "python offline_batch.py", version="0.32.0")
    fix = C.fix_invalid_choice(ctx)
    assert "--dtype float16" in fix.summary and "dtype='float16'" in fix.summary
    assert fix.edits == [SetFlag("--dtype", "float16")]
    shown = present(ctx.command, fix.edits, ctx.facts)
    assert shown.form == "flags" and shown.command is None and shown.changes == ["--dtype float16"]


def test_pydantic_bound_gpu_memory_utilization_belongs_to_its_own_rule():
    """gpu_memory_utilization's `le=1` bound is reported by gpu-memory-utilization-too-high (docs/reference/vllm-messages.md §3.2)."""
    from vllm_doctor.rules.catalog import load_catalog, match_text

    catalog = load_catalog(ROOT / "rules")
    text = "  Input should be less than or equal to 1 [type=less_than_equal, input_value=90, input_type=float]"
    assert match_text(catalog.rules["cli-invalid-choice"], text) is None
    assert match_text(catalog.rules["gpu-memory-utilization-too-high"], text) is not None


# ---------------------------------------------------------------- model-not-found

def test_local_typo_suggests_nearby_directory(tmp_path, ctx_for):
    (tmp_path / "Qwen2.5-7B-Instruct").mkdir()
    (tmp_path / "Llama-3.1-8B").mkdir()
    bad = str(tmp_path / "Qwen2.5-7B-Instrcut")
    ctx = ctx_for("model-not-found", f"ValueError: Invalid repository ID or local directory specified: '{bad}'.",
                  f"vllm serve {bad} --max-model-len 16384", version="0.32.0")
    fix = model.fix_model_not_found(ctx)
    good = str(tmp_path / "Qwen2.5-7B-Instruct")
    assert f"--model {good}" in fix.summary
    new = fixed(ctx, fix)
    assert new.render() == f"vllm serve {good} --max-model-len 16384"
    assert_accepted(new, "0.32.0")


def test_gated_repo_needs_token(ctx_for):
    text = ("huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-1)\n"
            "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/resolve/main/"
            "config.json.")
    ctx = ctx_for("model-not-found", text, "vllm serve meta-llama/Llama-3.1-8B-Instruct", version="0.10.1")
    fix = model.fix_model_not_found(ctx)
    assert "gated" in fix.summary and "HF_TOKEN" in fix.summary and "huggingface-cli login" in fix.summary
    assert any(isinstance(e, SetEnv) and e.name == "HF_TOKEN" for e in fix.edits)


def test_the_hub_s_answers_decide_the_fix(ctx_for):
    """huggingface_hub's and transformers' wordings (0.x requests, 1.x httpx): an invalid token is replaced, not
    'accept the licence'; a network failure or timeout is no offline-mode fix; a revision that does not exist names
    --revision; a repo without config.json names the file."""
    cmd = "vllm serve meta-llama/Llama-3.1-8B --revision v2.0"
    cases = {
        ("huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/api/"
         "models/meta-llama/Llama-3.1-8B/revision/main (Request ID: Root=1-1)\nInvalid credentials in Authorization "
         "header"): ("Replace the Hugging Face token", "licence"),
        ("requests.exceptions.ReadTimeout: (ReadTimeoutError(\"HTTPSConnectionPool(host='cdn-lfs-us-1.huggingface.co',"
         " port=443): Read timed out. (read timeout=10)\"), '(Request ID: 1)')"):
            ("cdn-lfs-us-1.huggingface.co: Read timed out", "HF_HUB_OFFLINE"),
        ("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the "
         "Hub and we cannot find the requested files in the local cache."): ("could not be reached", "HF_HUB_OFFLINE"),
        ("OSError: v2.0 is not a valid git identifier (branch name, tag name or commit id) that exists for this model "
         "name. Check the model page at 'https://huggingface.co/meta-llama/Llama-3.1-8B' for available revisions."):
            ("Check --revision v2.0", "HF_TOKEN"),
        ("OSError: Consistency check failed: file should be of size 4976698672 but has size 1048576 "
         "(model-00001-of-00004.safetensors)."): ("was cut (1,048,576 of 4,976,698,672 bytes)", "HF_TOKEN"),
        "RuntimeError: Data processing error: CAS service error : IO Error: Timer expired":
            ("HF_HUB_DISABLE_XET=1", "HF_HUB_OFFLINE"),
        ("OSError: We couldn't connect to 'https://hf-mirror.com' to load the files, and couldn't find them in the "
         "cached files."): ("could not be reached (hf-mirror.com", "HF_HUB_OFFLINE=0"),
        ("huggingface_hub.errors.HfHubHTTPError: 429 Too Many Requests: you have reached your 'resolvers' rate "
         "limit."): ("rate-limited", "licence"),
        ("ValueError: Fast download using 'hf_transfer' is enabled (HF_HUB_ENABLE_HF_TRANSFER=1) but 'hf_transfer' "
         "package is not available in your environment. Try `pip install hf_transfer`."): ("pip install hf_transfer",
                                                                                           "HF_TOKEN"),
        ("OSError: org/lora-adapter does not appear to have a file named config.json. Checkout "
         "'https://huggingface.co/org/lora-adapter/tree/main' for available files."): ("has no config.json", "HF_TOKEN"),
    }
    for text, (said, unsaid) in cases.items():
        fix = model.fix_model_not_found(ctx_for("model-not-found", text, cmd, version="0.10.1"))
        assert said in fix.summary and unsaid not in fix.summary, (text, fix.summary)


def test_offline_sets_hf_hub_offline_0(ctx_for):
    text = ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder for "
            "the specified revision on the local disk and outgoing traffic has been disabled.")
    ctx = ctx_for("model-not-found", text, "HF_HUB_OFFLINE=1 vllm serve Qwen/Qwen2.5-1.5B-Instruct --port 8005",
                  version="0.8.5")
    fix = model.fix_model_not_found(ctx)
    assert "HF_HUB_OFFLINE=0" in fix.summary
    new = fixed(ctx, fix)
    assert new.render() == "HF_HUB_OFFLINE=0 vllm serve Qwen/Qwen2.5-1.5B-Instruct --port 8005"
    assert_accepted(new, "0.8.5")


def test_docker_path_not_under_a_mount_is_noted(ctx_for):
    text = ("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
            "'namespace/repo_name': '/root/models/DS-7B'. Use `repo_type` argument if needed.")
    cmd = "docker run --gpus all -v /data/models:/models vllm/vllm-openai:v0.7.3 --model /root/models/DS-7B"
    fix = model.fix_model_not_found(ctx_for("model-not-found", text, cmd))
    assert "/root/models/DS-7B" in fix.summary
    assert any("/models" in n and "-v" in n for n in fix.notes)


def test_unknown_repo_id(ctx_for):
    text = ("OSError: mistralai/Mistral-7B-Instruct-v0.4 is not a local folder and is not a valid model identifier "
            "listed on 'https://huggingface.co/models'")
    fix = model.fix_model_not_found(ctx_for("model-not-found", text, None))
    assert "mistralai/Mistral-7B-Instruct-v0.4" in fix.summary and fix.edits == []


# ---------------------------------------------------------------- arch / transformers / remote code

def test_arch_unsupported_uses_model_impl_where_the_version_has_it(ctx_for):
    text = "ValueError: Model architectures ['Gemma3ForConditionalGeneration'] are not supported for now."
    ctx = ctx_for("arch-unsupported", text, "vllm serve google/gemma-3-12b-it", version="0.7.3")
    fix = C.fix_arch_unsupported(ctx)
    assert "--model-impl transformers" in fix.summary
    new = fixed(ctx, fix)
    assert new.get("--model-impl") == "transformers"
    assert_accepted(new, "0.7.3")


def test_arch_unsupported_before_model_impl_means_upgrade(ctx_for):
    text = "ValueError: Model architectures ['Qwen2ForCausalLM'] are not supported for now."
    ctx = ctx_for("arch-unsupported", text, "python -m vllm.entrypoints.openai.api_server --model Q/Q",
                  version="0.4.0")
    fix = C.fix_arch_unsupported(ctx)
    assert fix.summary.startswith("Upgrade vLLM") and fix.edits == []


def test_transformers_too_old_names_installed_version(ctx_for):
    text = ("ValueError: The checkpoint you are trying to load has model type `qwen3` but Transformers does not "
            "recognize this architecture.")
    ctx = ctx_for("transformers-too-old", text, "vllm serve Qwen/Qwen3-8B", facts={"env.versions": {"transformers": "4.50.3"}})
    fix = model.fix_transformers_too_old(ctx)
    # qwen3 first appears in CONFIG_MAPPING_NAMES of transformers 4.51.0 (its release notes: Qwen3, Llama 4)
    assert "pip install -U 'transformers>=4.51.0'" in fix.summary and "4.50.3" in fix.summary
    assert fix.arithmetic[0] == "model type 'qwen3' first appears in transformers 4.51.0; installed: 4.50.3"
    assert fixed(ctx, fix).render() == "vllm serve Qwen/Qwen3-8B"


def test_transformers_too_old_under_a_vllm_pin_that_excludes_the_release(ctx_for):
    """rc24: glm_ocr exists from transformers 5.1.0; vLLM 0.16.0's wheel requires transformers<5, so upgrading
    transformers alone would break vLLM (pip refuses or undoes it): vLLM must move to a release that admits it."""
    from vllm_doctor.facts import transformers_releases as tr

    text = ("Value error, The checkpoint you are trying to load has model type `glm_ocr` but Transformers does not "
            "recognize this architecture.")
    ctx = ctx_for("transformers-too-old", text, "vllm serve zai-org/GLM-OCR", version="0.16.0")
    fix = model.fix_transformers_too_old(ctx)
    assert tr.first_release("glm_ocr") == "5.1.0" and tr.vllm_requires("0.16.0")[1] == "<5,>=4.56.0"
    target = tr.first_vllm_allowing("5.1.0", after="0.16.0")
    assert target is not None and tr.allows_any_from(tr.vllm_requires(target)[1], "5.1.0")
    assert f"pip install -U 'vllm>={target}' 'transformers>=5.1.0'" in fix.summary
    assert any("<5,>=4.56.0" in a and "no release from 5.1.0" in a for a in fix.arithmetic)
    # the same type under a vLLM whose pin admits a later 5.x: transformers alone
    ok = model.fix_transformers_too_old(ctx_for("transformers-too-old", text, "vllm serve zai-org/GLM-OCR",
                                                version="0.29.0"))
    assert "vllm>=" not in ok.summary and "'transformers>=5.1.0'" in ok.summary


def test_transformers_too_old_reads_the_vllm_release_from_the_image_tag(ctx_for):
    """A config error can fail before vLLM's banner: the docker image's tag names the release whose pin counts."""
    text = ("Value error, The checkpoint you are trying to load has model type `glm_ocr` but Transformers does not "
            "recognize this architecture.")
    fix = model.fix_transformers_too_old(ctx_for("transformers-too-old", text,
                                                 "docker run --gpus all vllm/vllm-openai:v0.16.0 zai-org/GLM-OCR"))
    assert "'vllm>=" in fix.summary and "vLLM 0.16.0 does not accept it" in fix.summary


def test_transformers_too_old_type_in_no_release_says_so(ctx_for):
    text = ("ValueError: The checkpoint you are trying to load has model type `acme_lm` but Transformers does not "
            "recognize this architecture.")
    fix = model.fix_transformers_too_old(ctx_for("transformers-too-old", text, "vllm serve acme/lm"))
    assert "pip install -U transformers" in fix.summary and "in no transformers release up to" in fix.arithmetic[0]
    assert "git+https://github.com/huggingface/transformers.git" in fix.alternatives[0].summary


def test_transformers_table_reads_the_releases_in_order():
    """The shipped table's dates are consistent with its own release list: each type's first release is one
    of those read, and the well-known families arrive in their order (llama before qwen2 before qwen3)."""
    from vllm_doctor.command.versions import parse_version
    from vllm_doctor.facts import transformers_releases as tr

    table = tr._table()
    assert set(table["model_types"].values()) <= set(table["releases_read"])
    assert parse_version(tr.first_release("llama")) < parse_version(tr.first_release("qwen2")) \
        < parse_version(tr.first_release("qwen3"))
    assert tr.first_release("Qwen3") == tr.first_release("qwen3") and tr.first_release(None) is None


KEYERROR_TB = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/vllm/transformers_utils/config.py", line 245, in get_config
    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
  File "{file}", line 1021, in {func}
    {code}
KeyError: 'qwen3'"""


def test_keyerror_refine_keeps_config_mapping_and_drops_others(diagnose):
    mapping = KEYERROR_TB.format(file="/usr/local/lib/python3.12/site-packages/transformers/models/auto/"
                                      "configuration_auto.py", func="from_pretrained",
                                 code='config_class = CONFIG_MAPPING[config_dict["model_type"]]')
    assert diagnose(mapping).findings[0].rule == "transformers-too-old"
    other = KEYERROR_TB.format(file="/usr/local/lib/python3.12/site-packages/vllm/model_executor/models/llama.py",
                               func="load_weights", code="param = params_dict[name]")
    assert "transformers-too-old" not in [f.rule for f in diagnose(other).findings]


def test_trust_remote_code_serve(ctx_for):
    text = ("  Value error, The repository internlm/internlm2_5-7b-chat contains custom code which must be executed "
            "to correctly load the model.")
    cmd = "vllm serve internlm/internlm2_5-7b-chat --max-model-len 16384 -tp 2"
    ctx = ctx_for("trust-remote-code", text, cmd, version="0.10.1.1")
    fix = C.fix_trust_remote_code(ctx)
    assert "--trust-remote-code" in fix.summary and "internlm/internlm2_5-7b-chat" in fix.summary
    new = fixed(ctx, fix)
    assert new.render() == cmd + " --trust-remote-code"
    assert_accepted(new, "0.10.1.1")


def test_trust_remote_code_llm_call_is_edited_in_python(ctx_for):
    text = ("RuntimeError: Failed to load the model config. If the model is a custom model not yet available in the "
            "HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using the "
            "`--trust-remote-code` flag in the CLI.")
    ctx = ctx_for("trust-remote-code", text, 'LLM(model="THUDM/glm-4-9b-chat", max_model_len=8192)')
    new = fixed(ctx, C.fix_trust_remote_code(ctx))
    assert "trust_remote_code=True" in new.render()


# ---------------------------------------------------------------- port / fork

def test_port_in_use_moves_to_next_port(ctx_for):
    ctx = ctx_for("port-in-use", "OSError: [Errno 98] Address already in use",
                  "vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000", version="0.32.0", facts={"args.port": 8000})
    fix = ports.fix_port_in_use(ctx)
    assert fix.summary.startswith("Use --port 8001")
    new = fixed(ctx, fix)
    assert new.render() == "vllm serve Qwen/Qwen2.5-7B-Instruct --port 8001"
    assert_accepted(new, "0.32.0")


def test_uvicorn_port_capture_and_default_port(ctx_for):
    text = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    ctx = ctx_for("port-in-use", text, "python -m vllm.entrypoints.openai.api_server --model f/opt", version="0.5.3")
    new = fixed(ctx, ports.fix_port_in_use(ctx))
    assert new.get("--port") == "8001"
    assert_accepted(new, "0.5.3")


def test_port_in_use_live_probes_a_free_port(ctx_for):
    with socket.socket() as s, socket.socket() as s2:
        s.bind(("", 0))
        s.listen()
        busy = s.getsockname()[1]
        try:                       # hold busy+1 too (if someone else holds it, that is just as good)
            s2.bind(("", busy + 1))
            s2.listen()
        except OSError:
            pass
        ctx = ctx_for("port-in-use", "OSError: [Errno 98] Address already in use",
                      f"vllm serve m/x --port {busy}", facts={"args.port": busy, "doctor.live": True})
        fix = ports.fix_port_in_use(ctx)
        assert int(fixed(ctx, fix).get("--port")) > busy + 1


TCPSTORE = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 29501, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")


@pytest.mark.parametrize("command, expected_edit", [
    # one node: vLLM picked the port from VLLM_PORT upwards; this instance moves its range, --port stays
    ("VLLM_PORT=29500 vllm serve m/x -tp 2 --port 8001", SetEnv("VLLM_PORT", "29600")),
    ("vllm serve m/x -tp 2 --port 8001", SetEnv("VLLM_PORT", "29601")),
    # multi-node mp: the rendezvous is --master-port
    ("vllm serve m/x -tp 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --port 8001", SetFlag("--master-port", "29502")),
    # torchrun: MASTER_PORT
    ("torchrun --nproc-per-node 2 run.py --distributed-executor-backend external_launcher --port 8001",
     SetEnv("MASTER_PORT", "29502")),
])
def test_torch_distributed_port_clash_never_moves_the_http_port(command, expected_edit, ctx_for):
    ctx = ctx_for("port-in-use", TCPSTORE, command, version="0.11.0")
    fix = ports.fix_port_in_use(ctx)
    assert fix.edits == [expected_edit]
    assert not any(isinstance(e, SetFlag) and e.flag == "--port" for e in fix.edits)
    assert "8001" in " ".join(fix.notes) and fix.alternatives[0].summary.startswith("Stop the process")


def test_zmq_clash_moves_the_data_parallel_rpc_port_or_only_names_the_holder(ctx_for):
    text = "zmq.error.ZMQError: Address already in use (addr='tcp://10.0.0.1:13345')"
    ctx = ctx_for("port-in-use", text, "vllm serve m/x --data-parallel-size 4 --data-parallel-rpc-port 13345 --port 8000",
                  version="0.11.0")
    new = fixed(ctx, ports.fix_port_in_use(ctx))
    assert new.get("--data-parallel-rpc-port") == "13346" and new.get("--port") == "8000"
    other = ctx_for("port-in-use", "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:41000')",
                    "vllm serve m/x --port 8000", version="0.11.0")
    fix = ports.fix_port_in_use(other)
    assert fix.edits == [] and "41000" in fix.summary


def test_cuda_fork_sets_spawn(ctx_for):
    ctx = ctx_for("cuda-fork", "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                  "multiprocessing, you must use the 'spawn' start method",
                  "VLLM_WORKER_MULTIPROC_METHOD=fork vllm serve m/x -tp 2", version="0.6.1")
    new = fixed(ctx, C.fix_cuda_fork(ctx))
    assert new.render() == "VLLM_WORKER_MULTIPROC_METHOD=spawn vllm serve m/x -tp 2"
    assert_accepted(new, "0.6.1")


def test_a_model_directory_without_weights_says_to_finish_the_download(diagnose):
    d = diagnose("RuntimeError: Cannot find any model weights with `/models/Qwen2.5-7B-Instruct`",
                 command="vllm serve /models/Qwen2.5-7B-Instruct")
    assert d.findings[0].rule == "model-not-found"
    summary = d.findings[0].fix.summary
    assert "holds no weight files" in summary and "does not exist" not in summary


HUB_RETRY = ["(Worker pid=8142) '(ReadTimeoutError(\"HTTPSConnectionPool(host='huggingface.co', port=443): Read timed "
             "out. (read timeout=10)\"), '(Request ID: 3db76891)')' thrown while requesting HEAD "
             "https://huggingface.co/Qwen/Qwen3-8B/resolve/main/config.json",
             "(Worker pid=8142) Retrying in 1s [Retry 1/5]."]
LOADED = "(Worker pid=8142) INFO 04-08 10:41:02 [default_loader.py:308] Loading weights took 3.14 seconds"


def test_a_start_up_that_ends_retrying_the_hub_waits_on_the_hub(diagnose):
    """huggingface_hub's retry of a Hub request is a wait: a start-up whose log ends in it, nothing failing, waits on
    an unreachable Hub (model-not-found, the network fix); weights loading after it answer it (no finding)."""
    d = diagnose("\n".join(HUB_RETRY))
    assert [f.rule for f in d.findings] == ["model-not-found"]
    assert "could not be reached" in d.findings[0].fix.summary
    assert not diagnose("\n".join(HUB_RETRY + [LOADED])).findings


def test_a_headless_base_class_in_architectures_points_at_the_config(remedy_context):
    """Real unsloth#2070: a fine-tune saved from the base class lists Qwen2VLModel, which vLLM does not implement for
    generation; the fix is the config's class, not an upgrade. A class with its head keeps the upgrade."""
    ctx = remedy_context("ValueError: Qwen2VLModel has no vLLM implementation and the Transformers implementation is "
                         "not compatible with vLLM.", rule="arch-unsupported")
    fix = C.fix_arch_unsupported(ctx)
    assert "Qwen2VLForConditionalGeneration" in fix.summary and "architectures" in fix.summary
    ctx = remedy_context("ValueError: FooForCausalLM has no vLLM implementation and the Transformers implementation is "
                         "not compatible with vLLM.", rule="arch-unsupported")
    assert C.fix_arch_unsupported(ctx).summary.startswith("Upgrade vLLM")
