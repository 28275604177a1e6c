"""Every fact key the project writes or reads, with what it means: one registry (docs/DESIGN.md "Facts").

Keys are flat and dotted. A family (`args.*`) stands for keys built at run time.
Callers still spell keys as string literals; tests/test_tidy.py makes this registry binding: a key read
or written anywhere in src must be listed here, a key read must have a writer, and a key listed here
must still be used somewhere. The constants are there for code that wants a name instead of a string.
"""
from __future__ import annotations

# --------------------------------------------------------------------------- vLLM and the launch
VLLM_VERSION = "vllm.version"
LAUNCH_COMMAND = "launch.command"
LAUNCH_RECONSTRUCTED = "launch.reconstructed"
LAUNCH_ARGS_CUT = "launch.args_cut"
LAUNCH_VERSION_ESTIMATE = "launch.version_estimate"
LAUNCH_SCRIPT = "launch.script"
LAUNCH_SCRIPT_CODE = "launch.script_code"

# --------------------------------------------------------------------------- launch arguments
ARGS = "args.*"
ARGS_MODEL = "args.model"
ARGS_TENSOR_PARALLEL_SIZE = "args.tensor_parallel_size"
ARGS_PIPELINE_PARALLEL_SIZE = "args.pipeline_parallel_size"
ARGS_DATA_PARALLEL_SIZE = "args.data_parallel_size"
ARGS_NNODES = "args.nnodes"
ARGS_DISTRIBUTED_EXECUTOR_BACKEND = "args.distributed_executor_backend"
ARGS_MAX_MODEL_LEN = "args.max_model_len"
ARGS_GPU_MEMORY_UTILIZATION = "args.gpu_memory_utilization"
ARGS_KV_CACHE_MEMORY_BYTES = "args.kv_cache_memory_bytes"
ARGS_CPU_OFFLOAD_GB = "args.cpu_offload_gb"
ARGS_DTYPE = "args.dtype"
ARGS_QUANTIZATION = "args.quantization"
ARGS_KV_CACHE_DTYPE = "args.kv_cache_dtype"
ARGS_BLOCK_SIZE = "args.block_size"
ARGS_MAX_NUM_SEQS = "args.max_num_seqs"
ARGS_MAX_NUM_BATCHED_TOKENS = "args.max_num_batched_tokens"
ARGS_PORT = "args.port"

# --------------------------------------------------------------------------- what the log says
LOG_MAX_MODEL_LEN = "log.max_model_len"
LOG_MAX_CONCURRENCY = "log.max_concurrency"
LOG_WEIGHTS_GIB = "log.weights_gib"
LOG_KV_CACHE_GIB = "log.kv_cache_gib"
LOG_KV_CACHE_TOKENS = "log.kv_cache_tokens"
LOG_GPU_BLOCKS = "log.gpu_blocks"
LOG_TOTAL_GPU_GIB = "log.total_gpu_gib"
LOG_GPU_MEMORY_UTILIZATION = "log.gpu_memory_utilization"
LOG_PLATFORM = "log.platform"
LOG_PLATFORM_PLUGIN = "log.platform_plugin"
LOG_ARCHITECTURE = "log.architecture"
LOG_DISTRIBUTED_BACKEND = "log.distributed_backend"
LOG_CVD_SET_IN_CODE = "log.cvd_set_in_code"
LOG_MISSING_MODULE = "log.missing_module"
LOG_NCCL_VERSION = "log.nccl_version"
LOG_NODE_IPS = "log.node_ips"
LOG_HOSTNAMES = "log.hostnames"
LOG_RAY_ADDRESS = "log.ray_address"
LOG_RAY_CLUSTER_GPUS = "log.ray_cluster_gpus"
LOG_RAY_GPUS_SHORT = "log.ray_gpus_short"
LOG_UID_WITHOUT_USER = "log.uid_without_user"
LOG_OS = "log.os"
LOG_TORCH_CC_MIN = "log.torch_cc_min"
LOG_TORCH_CC_MAX = "log.torch_cc_max"
LOG_USAGE_FLAGS = "log.usage_flags"
LOG_VLLM_UNNAMED = "log.vllm_unnamed"

# --------------------------------------------------------------------------- the model (config.json)
MODEL_PATH = "model.path"
MODEL_CONFIG_LOADER = "model.config_loader"
MODEL_CONFIG_SOURCE = "model.config_source"
MODEL_ARCHITECTURES = "model.architectures"
MODEL_MODEL_TYPE = "model.model_type"
MODEL_TEXT_MODEL_TYPE = "model.text_model_type"
MODEL_NEEDS_REMOTE_CODE = "model.needs_remote_code"
MODEL_HAS_AUTO_MAP = "model.has_auto_map"
MODEL_NUM_ATTENTION_HEADS = "model.num_attention_heads"
MODEL_NUM_KV_HEADS = "model.num_kv_heads"
MODEL_NUM_LAYERS = "model.num_layers"
MODEL_HIDDEN_SIZE = "model.hidden_size"
MODEL_HEAD_DIM = "model.head_dim"
MODEL_INTERMEDIATE_SIZE = "model.intermediate_size"
MODEL_MOE_INTERMEDIATE_SIZE = "model.moe_intermediate_size"
MODEL_NUM_EXPERTS = "model.num_experts"
MODEL_SHARED_EXPERT_INTERMEDIATE_SIZE = "model.shared_expert_intermediate_size"
MODEL_DENSE_LAYERS = "model.dense_layers"
MODEL_DENSE_INTERMEDIATE_SIZE = "model.dense_intermediate_size"
MODEL_VOCAB_SIZE = "model.vocab_size"
MODEL_MAX_POSITION_EMBEDDINGS = "model.max_position_embeddings"
MODEL_DERIVED_MAX_MODEL_LEN = "model.derived_max_model_len"
MODEL_DERIVED_MAX_MODEL_LEN_KEY = "model.derived_max_model_len_key"
MODEL_SLIDING_WINDOW = "model.sliding_window"
MODEL_FULL_ATTENTION_LAYERS = "model.full_attention_layers"
MODEL_SLIDING_LAYERS = "model.sliding_layers"
MODEL_LINEAR_LAYERS = "model.linear_layers"
MODEL_LINEAR_MIXER_PARAMS = "model.linear_mixer_params"
MODEL_ATTN_OUTPUT_GATE = "model.attn_output_gate"
MODEL_DTYPE = "model.dtype"
MODEL_QUANT_METHOD = "model.quant_method"
MODEL_QUANT_GROUP_SIZE = "model.quant_group_size"
MODEL_QUANT_BITS = "model.quant_bits"
MODEL_QUANT_BITS_ATTENTION = "model.quant_bits_attention"    # mixed schemes: each part at its own bits
MODEL_QUANT_BITS_MLP = "model.quant_bits_mlp"
MODEL_QUANT_BITS_LM_HEAD = "model.quant_bits_lm_head"
MODEL_QUANT_WEIGHT_BLOCK_SIZE = "model.quant_weight_block_size"
MODEL_USE_MLA = "model.use_mla"
MODEL_KV_LORA_RANK = "model.kv_lora_rank"
MODEL_QK_ROPE_HEAD_DIM = "model.qk_rope_head_dim"
MODEL_QK_NOPE_HEAD_DIM = "model.qk_nope_head_dim"
MODEL_Q_LORA_RANK = "model.q_lora_rank"
MODEL_V_HEAD_DIM = "model.v_head_dim"
MODEL_VISION_NUM_HEADS = "model.vision_num_heads"
MODEL_VISION_PARAMS = "model.vision_params"
MODEL_VISION_TOKENS_PER_ITEM = "model.vision_tokens_per_item"
MODEL_VISION_PEAK_BYTES_PER_ITEM = "model.vision_peak_bytes_per_item"
MODEL_TIED_EMBEDDINGS = "model.tied_embeddings"
MODEL_WEIGHT_BYTES = "model.weight_bytes"
MODEL_WEIGHT_DTYPES = "model.weight_dtypes"
MODEL_WEIGHT_BYTES_METHOD = "model.weight_bytes_method"

# --------------------------------------------------------------------------- GPUs (NVML, collect-env)
GPU_COUNT = "gpu.count"
GPU_PHYSICAL_COUNT = "gpu.physical_count"
GPU_DEVICES = "gpu.devices"
GPU_VISIBLE = "gpu.visible"
GPU_DRIVER_VERSION = "gpu.driver_version"
GPU_CUDA_DRIVER_VERSION = "gpu.cuda_driver_version"
GPU_P2P = "gpu.p2p"
GPU_TOPOLOGY = "gpu.topology"
GPU_NVML_ERROR = "gpu.nvml_error"

# --------------------------------------------------------------------------- this machine's environment
ENV_IN_CONTAINER = "env.in_container"
ENV_CONTAINER_KIND = "env.container_kind"
ENV_SHM_TOTAL_BYTES = "env.shm_total_bytes"
ENV_SHM_FREE_BYTES = "env.shm_free_bytes"
ENV_VARS = "env.vars"
ENV_VERSIONS = "env.versions"
ENV_OS = "env.os"
ENV_CUDA_AVAILABLE = "env.cuda_available"
ENV_CUDA_RUNTIME_VERSION = "env.cuda_runtime_version"
ENV_TORCH_CUDA_VERSION = "env.torch_cuda_version"
ENV_NCCL_VERSION = "env.nccl_version"

# --------------------------------------------------------------------------- this node's network, a cluster's nodes
NET_HOSTNAME = "net.hostname"
NET_INTERFACES = "net.interfaces"
NODE_MODEL_PRESENT = "node.model_present"
NODE_NOTICES = "node.notices"
CLUSTER_NODES = "cluster.nodes"
CLUSTER_ADDRESS = "cluster.address"
CLUSTER_GPUS_PER_NODE = "cluster.gpus_per_node"

# --------------------------------------------------------------------------- a running server (health)
SERVER_URL = "server.url"
SERVER_MODELS = "server.models"
SERVER_STATE = "server.state"

# --------------------------------------------------------------------------- set while diagnosing
MEMORY_OOM_PHASE = "memory.oom_phase"
DOCTOR_LIVE = "doctor.live"
DOCTOR_MACHINE_FACTS = "doctor.machine_facts"


KEYS: dict[str, str] = {
    NET_HOSTNAME: "this machine's hostname (node probe)",
    NET_INTERFACES: "network interface -> IPv4 address of this machine (node probe; NCCL/GLOO_SOCKET_IFNAME must name one)",
    NODE_MODEL_PRESENT: "{model, present, where}: whether the node probe found the model locally (path or HF cache)",
    NODE_NOTICES: "what the node probe could not gather on that node",
    CLUSTER_NODES: "a cluster snapshot's nodes (facts/cluster.py ClusterNode as dicts): what the cluster checks compare",
    CLUSTER_ADDRESS: "the Ray address the cluster snapshot was taken from",
    CLUSTER_GPUS_PER_NODE: "the smallest GPU node's GPUs: tensor parallel stays within it",
    VLLM_VERSION: "vLLM version (log banner, collect-env, --vllm-version; pip metadata of this machine)",
    LAUNCH_COMMAND: "the launch command as text: --cmd, the log's `$ ...` line, or rebuilt from its args",
    LAUNCH_SCRIPT: "The user's script line that built the engine, from a traceback frame (`gen.py line 4`); "
                   "a fix is written as an edit of it",
    LAUNCH_SCRIPT_CODE: "The source of that line as the traceback printed it (`llm = LLM(model=..., ...)`)",
    LAUNCH_ARGS_CUT: "True when the logged arguments were cut short: the rebuilt command has only the model and "
                     "the flags remedies read",
    LAUNCH_VERSION_ESTIMATE: "With no version line in the log, the newest release whose parser had every argument the "
                             "log's args name (the release the rebuilt command is written for)",
    LAUNCH_RECONSTRUCTED: "True when launch.command was rebuilt from the logged arguments, not typed",

    ARGS: "a launch argument by its snake_case dest: vLLM's printed args / engine config, or the command's flags",
    ARGS_MODEL: "the model argument (`vllm serve MODEL`, --model, the banner's `serving model`)",
    ARGS_TENSOR_PARALLEL_SIZE: "--tensor-parallel-size",
    ARGS_PIPELINE_PARALLEL_SIZE: "--pipeline-parallel-size",
    ARGS_DATA_PARALLEL_SIZE: "--data-parallel-size",
    ARGS_NNODES: "--nnodes (multi-node launches)",
    ARGS_DISTRIBUTED_EXECUTOR_BACKEND: "--distributed-executor-backend (mp, ray, ...)",
    ARGS_MAX_MODEL_LEN: "--max-model-len as given (may be '32k', 'auto', -1)",
    ARGS_GPU_MEMORY_UTILIZATION: "--gpu-memory-utilization",
    ARGS_KV_CACHE_MEMORY_BYTES: "--kv-cache-memory-bytes (replaces the utilization budget)",
    ARGS_CPU_OFFLOAD_GB: "--cpu-offload-gb",
    ARGS_DTYPE: "--dtype",
    ARGS_QUANTIZATION: "--quantization",
    ARGS_KV_CACHE_DTYPE: "--kv-cache-dtype",
    ARGS_BLOCK_SIZE: "--block-size (KV cache block, tokens)",
    ARGS_MAX_NUM_SEQS: "--max-num-seqs",
    ARGS_MAX_NUM_BATCHED_TOKENS: "--max-num-batched-tokens",
    ARGS_PORT: "--port (the API server's HTTP port)",

    LOG_MAX_MODEL_LEN: "max model len vLLM settled on (`Using max model len`, engine config max_seq_len)",
    LOG_MAX_CONCURRENCY: "`Maximum concurrency for N tokens per request: Xx`",
    LOG_WEIGHTS_GIB: "GiB of weights per GPU (`Model loading took X GiB`)",
    LOG_KV_CACHE_GIB: "GiB available for the KV cache per GPU (`Available KV cache memory`)",
    LOG_KV_CACHE_TOKENS: "tokens the KV cache holds (`KV cache size: N tokens`)",
    LOG_GPU_BLOCKS: "KV cache blocks (`# GPU blocks: N`)",
    LOG_TOTAL_GPU_GIB: "GPU memory vLLM saw (`total_gpu_memory (X GiB) x gpu_memory_utilization`)",
    LOG_GPU_MEMORY_UTILIZATION: "the utilization in that same line",
    LOG_PLATFORM: "`Automatically detected platform X`",
    LOG_PLATFORM_PLUGIN: "`Platform plugin X is activated`: an out-of-tree platform (vllm-ascend, ...)",
    LOG_ARCHITECTURE: "`Resolved architecture: X`",
    LOG_DISTRIBUTED_BACKEND: "`Defaulting to use X for distributed inference`",
    LOG_CVD_SET_IN_CODE: "CUDA_VISIBLE_DEVICES a script sets in Python (os.environ[...] = ...), as the log shows",
    LOG_MISSING_MODULE: "the last module a traceback of the log could not import (`No module named 'X'`)",
    LOG_NCCL_VERSION: "`NCCL version X`",
    LOG_NODE_IPS: "node IPs the log prints: Ray's `ip=` prefixes, NCCL's bootstrap interface (sorted list)",
    LOG_HOSTNAMES: "host names the log prints: NCCL's `host:pid:tid [rank] NCCL ...` prefix (sorted list)",
    LOG_RAY_ADDRESS: "the Ray cluster's address the driver joined (`Connecting to existing Ray cluster at address: A:P`)",
    LOG_RAY_CLUSTER_GPUS: "GPUs in the Ray cluster, as a pasted `ray status` counts them (`0.0/1.0 GPU`)",
    LOG_RAY_GPUS_SHORT: "vLLM's own count said the Ray cluster has fewer GPUs than the group needs (ray_utils' warning)",
    LOG_OS: "the operating system the log's Python frames place it on (`macOS`: /Users/…, Homebrew, Python.framework; `Windows`: a drive)",
    LOG_TORCH_CC_MIN: "the lowest compute capability torch says its build supports (`(8.0) - (12.0)`, torch 2.8-2.10)",
    LOG_TORCH_CC_MAX: "the highest compute capability torch says its build supports (`(8.0) - (12.0)`, torch 2.8-2.10)",
    LOG_USAGE_FLAGS: "the options the installed vLLM's parser listed in the `usage:` it printed before an argparse error",
    LOG_VLLM_UNNAMED: "`The vLLM package was not found, so its version could not be inspected`: no distribution named vllm",
    LOG_UID_WITHOUT_USER: "a UID with no passwd entry, as Python's getpass.getuser() said it (`getpwuid(): uid not found`)",

    MODEL_PATH: "the local directory config.json was read from",
    MODEL_CONFIG_LOADER: "how config.json was read: transformers or json; \"model table\" when none was here",
    MODEL_CONFIG_SOURCE: "where the model.* numbers came from when no config.json is here: the shipped table's row source",
    MODEL_ARCHITECTURES: "config.json architectures (list)",
    MODEL_MODEL_TYPE: "config.json model_type",
    MODEL_TEXT_MODEL_TYPE: "model_type of the text config of a multimodal model",
    MODEL_NEEDS_REMOTE_CODE: "the config needs --trust-remote-code (auto_map without a native class)",
    MODEL_HAS_AUTO_MAP: "config.json has an auto_map",
    MODEL_NUM_ATTENTION_HEADS: "attention heads",
    MODEL_NUM_KV_HEADS: "KV heads (num_key_value_heads, multi_query, MPT/DBRX kv_n_heads)",
    MODEL_NUM_LAYERS: "hidden layers",
    MODEL_HIDDEN_SIZE: "hidden size",
    MODEL_HEAD_DIM: "head dimension (explicit, or hidden / heads)",
    MODEL_INTERMEDIATE_SIZE: "MLP intermediate size (DBRX: ffn_hidden_size)",
    MODEL_MOE_INTERMEDIATE_SIZE: "MoE expert intermediate size",
    MODEL_NUM_EXPERTS: "MoE experts",
    MODEL_SHARED_EXPERT_INTERMEDIATE_SIZE: "MoE shared expert(s): the MLP width every token passes besides the routed ones",
    MODEL_DENSE_LAYERS: "MoE layers without experts (DeepSeek's first_k_dense_replace, Llama 4's interleaving)",
    MODEL_DENSE_INTERMEDIATE_SIZE: "the MLP width of an MoE's dense layers",
    MODEL_VOCAB_SIZE: "vocabulary size",
    MODEL_MAX_POSITION_EMBEDDINGS: "max_position_embeddings",
    MODEL_DERIVED_MAX_MODEL_LEN: "the max model len vLLM derives from the config (rope scaling, model_max_length)",
    MODEL_DERIVED_MAX_MODEL_LEN_KEY: "the config key that derived length came from",
    MODEL_SLIDING_WINDOW: "sliding window (when used)",
    MODEL_FULL_ATTENTION_LAYERS: "full-attention layers of a model that mixes layer kinds",
    MODEL_SLIDING_LAYERS: "sliding-window layers of a model that mixes layer kinds",
    MODEL_LINEAR_LAYERS: "linear-attention / state-space layers of a hybrid model",
    MODEL_LINEAR_MIXER_PARAMS: "parameters of one linear-attention layer's projections (gated delta net)",
    MODEL_ATTN_OUTPUT_GATE: "full attention gates its output (the query projection is twice as wide)",
    MODEL_DTYPE: "config torch_dtype / dtype",
    MODEL_QUANT_METHOD: "quantization_config.quant_method",
    MODEL_QUANT_GROUP_SIZE: "quantization group size",
    MODEL_QUANT_BITS: "quantized weight bits",
    MODEL_QUANT_BITS_ATTENTION: "attention's weight bits (mixed scheme)",
    MODEL_QUANT_BITS_MLP: "MLP / experts' weight bits (mixed scheme)",
    MODEL_QUANT_BITS_LM_HEAD: "lm_head's weight bits (mixed scheme)",
    MODEL_QUANT_WEIGHT_BLOCK_SIZE: "block-wise fp8 weight_block_size",
    MODEL_USE_MLA: "the model uses multi-head latent attention (DeepSeek V2/V3)",
    MODEL_KV_LORA_RANK: "MLA kv_lora_rank",
    MODEL_QK_ROPE_HEAD_DIM: "MLA qk_rope_head_dim",
    MODEL_QK_NOPE_HEAD_DIM: "MLA qk_nope_head_dim",
    MODEL_Q_LORA_RANK: "MLA q_lora_rank (none: a full query projection)",
    MODEL_V_HEAD_DIM: "MLA v_head_dim",
    MODEL_VISION_NUM_HEADS: "vision tower attention heads",
    MODEL_VISION_PARAMS: "vision tower and projector parameters (estimated from vision_config)",
    MODEL_VISION_TOKENS_PER_ITEM: "tokens the largest image becomes (vLLM profiles the encoder with it)",
    MODEL_VISION_PEAK_BYTES_PER_ITEM: "bytes alive at the vision tower's peak for the largest image",
    MODEL_TIED_EMBEDDINGS: "the output layer shares the input embedding's weights (tie_word_embeddings)",
    MODEL_WEIGHT_BYTES: "checkpoint weight bytes (safetensors headers / index, else estimated)",
    MODEL_WEIGHT_DTYPES: "dtypes seen in the checkpoint",
    MODEL_WEIGHT_BYTES_METHOD: "how model.weight_bytes was found",

    GPU_COUNT: "GPUs visible to vLLM (after CUDA_VISIBLE_DEVICES; --gpus for plan)",
    GPU_PHYSICAL_COUNT: "GPUs NVML sees on the machine",
    GPU_DEVICES: "one dict per GPU {index, name, uuid, memory_*_mib, compute_capability, processes, mig_*}; "
                 "read through vllm_doctor.facts.gpus",
    GPU_VISIBLE: "CUDA_VISIBLE_DEVICES mapped: {raw, set, devices, invalid, duplicates, ignored, notes, count}",
    GPU_DRIVER_VERSION: "NVIDIA driver version",
    GPU_CUDA_DRIVER_VERSION: "CUDA version the driver supports",
    GPU_P2P: "peer-to-peer status between GPUs: {read, write, nvlink} matrices of 'OK' / reasons",
    GPU_TOPOLOGY: "`nvidia-smi topo -m` matrix (X, NV#, PIX, PXB, PHB, NODE, SYS)",
    GPU_NVML_ERROR: "why NVML gave no GPU facts (one line)",

    ENV_IN_CONTAINER: "this process runs in a container",
    ENV_CONTAINER_KIND: "docker, podman, kubernetes, ... (None outside one)",
    ENV_SHM_TOTAL_BYTES: "/dev/shm size",
    ENV_SHM_FREE_BYTES: "/dev/shm free bytes",
    ENV_VARS: "relevant environment variables (secrets left out): name -> value",
    ENV_VERSIONS: "package versions: name -> version (vllm, torch, transformers, nccl ...)",
    ENV_OS: "collect-env OS line",
    ENV_CUDA_AVAILABLE: "collect-env `Is CUDA available`",
    ENV_CUDA_RUNTIME_VERSION: "collect-env CUDA runtime version",
    ENV_TORCH_CUDA_VERSION: "collect-env `CUDA used to build PyTorch`",
    ENV_NCCL_VERSION: "collect-env NCCL version",

    MEMORY_OOM_PHASE: "where a CUDA OOM happened, a key of events.phases.PHASE_NAMES (set by refine/oom_phase.py)",
    DOCTOR_MACHINE_FACTS: "whether this machine's GPUs and environment were used, and why ({used, reason})",
    SERVER_URL: "the running server `health` read (its base URL)",
    SERVER_MODELS: "the model ids the running server serves (/v1/models)",
    SERVER_STATE: "what `health` read: requests running and waiting, the KV cache's use, and the counters' growth",
    DOCTOR_LIVE: "the doctor reads the server's output as it runs, on its machine (pipe, run, --follow; not --no-live)",
}
