"""Which package sits on the other side of vLLM in a traceback's frames (refine/version_skew.py): a signature
TypeError there is the two packages not released for each other; elsewhere it is no installation problem."""
from vllm_doctor.refine.version_skew import counterpart, package

SITE = "/usr/local/lib/python3.10/dist-packages"


def test_the_package_of_a_frame():
    assert package(f"{SITE}/vllm/entrypoints/llm.py") == "vllm"
    assert package("/vllm-workspace/vllm-ascend/vllm_ascend/worker/model_runner_v1.py") == "vllm_ascend"
    assert package("/home/me/src/vllm/vllm/engine/arg_utils.py") == "vllm"          # a source checkout
    assert package(f"{SITE}/vllm/vllm_flash_attn/flash_attn_interface.py") == "vllm"  # vLLM's own vendored copy
    assert package("/huggingfaceserver/huggingfaceserver/vllm/vllm_model.py") is None  # a package's vllm/ module
    assert package("/usr/lib/python3.10/runpy.py") is None


def test_a_plugin_or_a_caller_of_vllm_is_the_counterpart():
    plugin = [f"{SITE}/vllm/v1/executor/multiproc_executor.py", "/ws/vllm-ascend/vllm_ascend/worker/worker_v1.py"]
    assert counterpart(plugin) == "vllm_ascend"
    trl = ["/usr/local/bin/trl", f"{SITE}/trl/scripts/vllm_serve.py", f"{SITE}/vllm/entrypoints/llm.py"]
    assert counterpart(trl) == "trl"


def test_no_counterpart_where_vllm_calls_down_or_machinery_calls_it():
    # vLLM calling transformers: that library's version, not a package built on vLLM
    assert counterpart([f"{SITE}/vllm/transformers_utils/tokenizer.py", f"{SITE}/transformers/tokenization_utils.py"]) \
        is None
    # Ray's worker machinery above vLLM's own frames calls nothing of its own
    assert counterpart([f"{SITE}/ray/_private/worker.py", f"{SITE}/vllm/worker/worker.py"]) is None
    assert counterpart([f"{SITE}/trl/scripts/vllm_serve.py"]) is None                 # no vLLM frame at all
