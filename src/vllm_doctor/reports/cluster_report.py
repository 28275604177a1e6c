"""`facts --ray` as text: one line per node, what the cluster checks compare."""
from __future__ import annotations

from vllm_doctor.facts.cluster import summarize

VERSIONS = ("vllm", "torch", "ray", "transformers")


def _node_line(n) -> str:
    if n.state != "ok":
        return f"  {n.label:<24} {n.state}: {n.why}"
    gpus = "no GPU (NVML)" if not n.gpus else f"{n.gpus}x {n.gpu_names[0] if n.gpu_names else 'GPU'}" + (
        f" {n.gpu_total_gib:g} GiB" if n.gpu_total_gib else "")
    if n.ray_gpus is not None and n.ray_gpus != (n.gpus or 0):
        gpus += f" (Ray schedules {n.ray_gpus:g})"
    parts = [gpus]
    versions = " ".join(f"{k} {n.versions[k]}" for k in VERSIONS if k in n.versions)
    if versions:
        parts.append(versions)
    for var in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES"):
        if var in n.vars:
            parts.append(f"{var}={n.vars[var]}")
    if n.shm_total_bytes is not None:
        parts.append(f"/dev/shm {n.shm_total_bytes / 2**30:.1f} GiB")
    if n.model is not None:
        parts.append(f"model {'here' if n.model.get('present') else 'MISSING'}")
    host = f" {n.hostname}" if n.hostname else ""
    return f"  {n.label:<24}{host}: " + "; ".join(parts)


def render_cluster_text(doc: dict) -> str:
    nodes = summarize(doc)
    ok = sum(n.state == "ok" for n in nodes)
    head = f"Ray cluster at {doc.get('address') or '?'}: {len(nodes)} node{'s' if len(nodes) != 1 else ''}, {ok} answered"
    tail = "save it with --format json; then: vllm-doctor check --facts cluster.json -- vllm serve ..."
    return "\n".join([head, *(_node_line(n) for n in nodes), tail]) + "\n"
