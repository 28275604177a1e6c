"""A printed args repr the log cut short gives only its whole pairs (real: logs_corpus/real/config rc32, parallel rp05)."""
from vllm_doctor.command.fromargs import is_cut, parse_args_repr


def test_a_cut_namespace_keeps_whole_pairs_and_drops_the_cut_one():
    text = ("Namespace(model_tag='facebook/opt-125m', config='', host=None, port=19000, uvicorn_log_level='info', "
            "allow_credentials=False, allowed_origins=['*'], ch")
    assert is_cut(text)
    assert parse_args_repr(text) == {"model_tag": "facebook/opt-125m", "config": "", "host": None, "port": 19000,
                                     "uvicorn_log_level": "info", "allow_credentials": False, "allowed_origins": ["*"]}


def test_a_cut_dict_drops_a_half_printed_object_repr():
    text = ("{'model_tag': '/app/model', 'tensor_parallel_size': 3, 'attention_config': AttentionConfig(backend=None, "
            "minimax_m3_msa_decode_backend='triton', use_prefill_")
    assert parse_args_repr(text) == {"model_tag": "/app/model", "tensor_parallel_size": 3}


def test_a_whole_repr_is_read_as_before():
    assert not is_cut("Namespace(model='x', port=8000)")
    assert parse_args_repr("Namespace(model='x', port=8000)") == {"model": "x", "port": 8000}
    assert parse_args_repr("{'model': 'x', 'compilation_config': CompilationConfig(level=3)}") == {
        "model": "x", "compilation_config": "CompilationConfig(level=3)"}


def test_an_enum_members_repr_is_read_as_its_value():
    # vLLM 0.6.4's Namespace prints ConfigFormat members (c901): the command line spells them by value
    text = "Namespace(model='m', config_format=<ConfigFormat.AUTO: 'auto'>, load_format=<LoadFormat.DUMMY: 'dummy'>)"
    assert parse_args_repr(text) == {"model": "m", "config_format": "auto", "load_format": "dummy"}
    assert parse_args_repr("Namespace(dispatch_function=<function serve at 0x7f>)")["dispatch_function"] \
        == "<function serve at 0x7f>"
