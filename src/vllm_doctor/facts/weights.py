"""Estimate a checkpoint's weight bytes without loading it: only safetensors headers (8-byte length +
JSON) are read; then the shard index's metadata.total_size; then plain file sizes."""
from __future__ import annotations

import struct
from pathlib import Path

from vllm_doctor.numbers import as_int, json_loads

MAX_HEADER = 100 * 1024 * 1024  # the safetensors format caps its header at 100 MB
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
NOT_WEIGHTS = ("training_args", "optimizer", "scheduler", "rng_state")  # trainer leftovers


def safetensors_header(path: Path) -> dict | None:
    """The JSON header of one safetensors file, or None when it is not one (e.g. a git-lfs pointer)."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (size,) = struct.unpack("<Q", raw)
            if size == 0 or size > MAX_HEADER:
                return None
            header = json_loads(f.read(size))
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _header_bytes(header: dict) -> tuple[int, set[str]]:
    total, dtypes = 0, set()
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets = entry.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2:     # anything else: no bytes known for it
            begin, end = as_int(offsets[0]), as_int(offsets[1])
            if begin is not None and end is not None and end > begin >= 0:
                total += end - begin
        if entry.get("dtype"):
            dtypes.add(str(entry["dtype"]))
    return total, dtypes


def estimate_weights(model_dir: Path) -> tuple[int | None, list[str], str | None]:
    """(bytes, sorted dtypes seen in headers, how it was estimated) for the checkpoint in model_dir."""
    shards = sorted(model_dir.glob("*.safetensors"))
    total, dtypes, parsed = 0, set(), 0
    for shard in shards:
        header = safetensors_header(shard)
        if header is None:
            continue
        size, kinds = _header_bytes(header)
        total += size
        dtypes |= kinds
        parsed += 1
    if shards and parsed == len(shards):
        return total, sorted(dtypes), "safetensors headers"
    index = model_dir / "model.safetensors.index.json"
    try:
        meta = json_loads(index.read_text(encoding="utf-8")).get("metadata") or {}
        size = as_int(meta.get("total_size"))
        if size is not None and size > 0:
            return size, sorted(dtypes), "safetensors index"
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    files = [p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
             and not p.name.startswith(NOT_WEIGHTS)]
    if files:
        return sum(p.stat().st_size for p in files), sorted(dtypes), "file sizes"
    return None, [], None
