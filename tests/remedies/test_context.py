"""RemedyContext (remedies/context.py): the accessors every remedy reads its evidence, facts and command through,
on contexts the real engine builds (the remedy_context fixture)."""
from vllm_doctor.facts import Facts
from vllm_doctor.facts.shape import ModelShape

SHM = [  # nccl-shm: two fatal lines and a supporting one, in log order
    "node1:2143:2561 [1] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-a "
    "(size 9637888)",
    "gpu7:3301:3377 [2] misc/shmutils.cc:41 NCCL WARN Call to open failed : Permission denied",
    "node1:2143:2561 [1] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-b "
    "(size 7340032)",
]


def test_evidence_accessors_follow_the_log(remedy_context):
    ctx = remedy_context(SHM, rule="nccl-shm")
    assert ctx.capture("shm_size") == "9637888" and ctx.capture_int("shm_size") == 9637888
    assert ctx.capture_float("shm_size") == 9637888.0 and ctx.capture("nope") is None
    assert ctx.captures_all("shm_size") == ["9637888", "7340032"]
    assert ctx.capture("syscall") == "open"                      # a supporting match's capture
    assert ctx.pattern_names == {"shm-create-segment", "shm-syscall"}
    assert ctx.has_pattern("bus-error", "shm-syscall") and not ctx.has_pattern("bus-error")
    assert [m.captures["shm_path"] for m in ctx.matches_named("shm-create-segment")] == ["/dev/shm/nccl-a",
                                                                                          "/dev/shm/nccl-b"]
    assert ctx.lines == SHM


def test_facts_first_known_wins(remedy_context):
    ctx = remedy_context(SHM, rule="nccl-shm", facts={"env.shm_total_bytes": "67,108,864", "gpu.count": 2})
    assert ctx.fact("env.shm_free_bytes", "env.shm_total_bytes") == "67,108,864"
    assert ctx.fact_int("env.shm_total_bytes") == 64 << 20 and ctx.fact_float("gpu.count") == 2.0
    assert ctx.fact("env.shm_free_bytes", default="?") == "?"


def test_launch_arguments_command_first_then_the_logged_args(remedy_context):
    ctx = remedy_context(SHM, rule="nccl-shm", command="vllm serve m -tp 4 --enforce-eager",
                         facts={"args.pipeline_parallel_size": 2, "args.max_model_len": "none"})
    assert ctx.arg("tensor_parallel_size") == "4" and ctx.arg_int("tensor_parallel_size") == 4
    assert ctx.arg_int("pipeline_parallel_size") == 2 and ctx.world_size == 8
    assert ctx.arg("max_model_len") is None and ctx.arg_float("gpu_memory_utilization") is None
    assert ctx.flag("--enforce-eager") is True and ctx.flag("--max-model-len") is None
    logged = remedy_context(["INFO 05-12 10:11:12 [api_server.py:98] non-default args: {'model': 'm', "
                             "'tensor_parallel_size': 2}"] + SHM, rule="nccl-shm")
    assert logged.arg_int("tensor_parallel_size") == 2 and logged.world_size == 2


def test_env_and_container_shape_come_from_the_command_model(remedy_context):
    plain = remedy_context(SHM, rule="nccl-shm", command="NCCL_DEBUG=INFO vllm serve m",
                           facts={"env.vars": {"NCCL_DEBUG": "WARN", "HF_HOME": "/hf"}})
    assert plain.env("NCCL_DEBUG") == "INFO" and plain.env("HF_HOME") == "/hf" and plain.env("X") is None
    assert not plain.is_docker and not plain.in_container
    docker = remedy_context(SHM, rule="nccl-shm", command="HOST_ONLY=1 docker run -e NCCL_DEBUG=TRACE img m")
    assert docker.env("NCCL_DEBUG") == "TRACE" and docker.env("HOST_ONLY") is None   # host env stays outside
    assert docker.is_docker and docker.in_container
    inside = remedy_context(SHM, rule="nccl-shm", command="vllm serve m", facts={"env.in_container": True})
    assert inside.in_container and not inside.is_docker


def test_version_gpus_and_shape(remedy_context, fake_nvml):
    from vllm_doctor.facts.nvml import collect_gpu_facts

    facts = Facts()
    collect_gpu_facts(facts, fake_nvml.rtx4090_x2(), environ={})
    facts.set("vllm.version", "0.10.1", "log")
    facts.set("model.num_attention_heads", 32, "config.json")
    ctx = remedy_context(SHM, rule="nccl-shm", facts=facts)
    assert ctx.version == "0.10.1"
    assert [d["index"] for d in ctx.gpus] == [0, 1]
    assert isinstance(ctx.shape, ModelShape) and ctx.shape.heads == 32 and ctx.shape is ctx.shape
