"""vllm-doctor: tells why a vLLM server failed to start and hands back the command that works."""

__version__ = "0.1.0"
