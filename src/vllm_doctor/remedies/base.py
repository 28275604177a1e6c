"""Transitional: the remedy context is remedies/context.py, Fix and Alternative are in vllm_doctor.findings.
Goes away once remedies/memory.py and remedies/parallel.py import from those."""
from vllm_doctor.findings import Alternative, Fix  # noqa: F401
from vllm_doctor.remedies.context import RemedyContext  # noqa: F401
