"""Map CUDA_VISIBLE_DEVICES onto the physical GPUs NVML reports.

CUDA's rules: entries are comma separated; an entry is an index, a GPU UUID (`GPU-…`, a unique prefix
is enough) or a MIG device (`MIG-<uuid>`, or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`); parsing stops
at the first invalid entry (later entries are silently ignored); an empty value hides every GPU; a
repeated device makes the whole list empty (as PyTorch's _parse_visible_devices mirrors).
"""
from __future__ import annotations

from typing import Any

from vllm_doctor.numbers import parse_int


def _match_uuid(entry: str, devices: list[dict]) -> list[dict]:
    return [d for d in devices if str(d.get("uuid", "")).startswith(entry)]


def _match_mig(entry: str, devices: list[dict]) -> tuple[dict, dict] | None:
    legacy = entry.startswith("MIG-GPU-")
    gpu_uuid = entry[len("MIG-"):].split("/")[0] if legacy else None
    for dev in devices:
        for mig in dev.get("mig_devices") or []:
            if not legacy and mig.get("uuid") == entry:
                return dev, mig
            if legacy and dev.get("uuid") == gpu_uuid:
                parts = entry.split("/")
                if len(parts) == 3 and str(mig.get("gpu_instance_id")) == parts[1] \
                        and str(mig.get("compute_instance_id")) == parts[2]:
                    return dev, mig
    return None


def _resolve(entry: str, devices: list[dict]) -> dict | None:
    if entry.isdigit():
        index = parse_int(entry)                 # None: `²`, or more digits than any index has
        if index is None:
            return None
        return {"entry": entry, "kind": "index", "physical_index": index,
                "uuid": devices[index].get("uuid")} if index < len(devices) else None
    if entry.startswith("MIG-"):
        found = _match_mig(entry, devices)
        if found is None:
            return None
        dev, mig = found
        return {"entry": entry, "kind": "mig", "physical_index": dev["index"], "uuid": mig.get("uuid")}
    if entry.startswith("GPU-"):
        matches = _match_uuid(entry, devices)
        if len(matches) != 1:  # unknown, or an ambiguous prefix
            return None
        return {"entry": entry, "kind": "uuid", "physical_index": matches[0]["index"],
                "uuid": matches[0].get("uuid")}
    return None


def map_visible_devices(value: str | None, devices: list[dict], device_order: str | None = None) -> dict[str, Any]:
    """{"raw", "set", "devices": [{entry, kind, physical_index, uuid}], "invalid", "duplicates",
    "ignored", "count", "notes"}."""
    out: dict[str, Any] = {"raw": value, "set": value is not None, "devices": [], "invalid": [],
                           "duplicates": [], "ignored": [], "notes": []}
    if value is None:
        out["devices"] = [{"entry": None, "kind": "all", "physical_index": d["index"], "uuid": d.get("uuid")}
                          for d in devices]
    else:
        entries = [e.strip() for e in value.split(",")] if value.strip() else []
        seen: set[tuple] = set()
        for pos, entry in enumerate(entries):
            resolved = _resolve(entry, devices) if entry else None
            if resolved is None:
                out["invalid"].append(entry)
                out["ignored"] = entries[pos + 1:]  # CUDA stops at the first invalid entry
                break
            key = (resolved["physical_index"], resolved["uuid"])
            if key in seen:
                out["duplicates"].append(entry)
                continue
            seen.add(key)
            out["devices"].append(resolved)
        if not entries:
            out["notes"].append("CUDA_VISIBLE_DEVICES is empty: no GPU is visible")
        if out["duplicates"]:
            out["devices"] = []
            out["notes"].append("a repeated device in CUDA_VISIBLE_DEVICES makes CUDA see no GPU at all")
        if sum(1 for d in out["devices"] if d["kind"] == "mig") > 1:
            out["notes"].append("a CUDA process can use only one MIG device")
    names = {d.get("name") for d in devices}
    if len(names) > 1 and device_order != "PCI_BUS_ID":
        out["notes"].append("mixed GPU models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: "
                            "CUDA indices may differ from nvidia-smi's")
    out["count"] = len(out["devices"])
    return out
