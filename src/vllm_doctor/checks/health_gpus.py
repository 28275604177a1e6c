"""`health`'s GPU side: the GPUs a running server's ranks should hold (its launch's -tp x -pp, on the devices its
CUDA_VISIBLE_DEVICES names, in CUDA's order) read from NVML or a snapshot. Every rank of a started server holds
its weights and its KV cache, so a GPU of the group holding a small part of what the others hold carries no
rank: the ranks are elsewhere (another numbering than the one assumed) or one never came up."""
from __future__ import annotations

from vllm_doctor.checks.coverage import Prediction
from vllm_doctor.facts import Facts, gpus
from vllm_doctor.facts.visible import map_visible_devices

IDLE_SHARE = 0.25      # a GPU of the group holding less than this part of the fullest one carries no rank
MIN_RANK_GIB = 4.0     # below this the fullest GPU is no started server (a rank holds weights and a KV cache)


def layout_size(command, flag: str) -> int:
    """A launch's -tp/-pp/-dp as a positive int (1 when absent or not a number)."""
    value = command.get(flag) if command is not None else None
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else 1


def group_of(command, facts: Facts, environ: dict[str, str]) -> tuple[list[dict], str] | None:
    """The devices (NVML entries) the launch's ranks use on this machine, in rank order, and the layout said as
    flags (`-tp 4`); None when the launch or the GPUs are unknown, or the group spans more than this machine."""
    devices = [d for d in gpus.devices(facts) if gpus.used_gib(d) is not None]
    if command is None or not devices:
        return None
    tp, pp = layout_size(command, "--tensor-parallel-size"), layout_size(command, "--pipeline-parallel-size")
    dp = layout_size(command, "--data-parallel-size")      # the default DP backend starts its replicas here
    env = {**environ, **command.env}
    visible = map_visible_devices(env.get("CUDA_VISIBLE_DEVICES"), devices, env.get("CUDA_DEVICE_ORDER"))
    by_index = {d["index"]: d for d in devices}
    ordered = [by_index[v["physical_index"]] for v in visible["devices"] if v.get("physical_index") in by_index]
    if tp * pp * dp > len(ordered) or command.get("--distributed-executor-backend") == "ray":
        return None          # a group over nodes: this machine holds only a part of it
    layout = " ".join(f"{flag} {n}" for flag, n in (("-tp", tp), ("-pp", pp), ("-dp", dp)) if n > 1) or "-tp 1"
    return ordered[:tp * pp * dp], layout


def idle_gpus(command, facts: Facts, environ: dict[str, str] | None,
              rank_weights_gib: float | None = None) -> list[Prediction]:
    """A GPU of the server's group holding far less than the fullest one, as the line the rule reads. `environ`
    is the server process's own (None: unread, so its CUDA_VISIBLE_DEVICES is a guess: medium confidence).
    `rank_weights_gib`: one rank's weights by the memory model (the launch's model config), when known: a group
    whose every GPU holds far less than that holds no rank at all (the whole group is elsewhere)."""
    found = group_of(command, facts, environ or {})
    if found is None:
        return []
    group, layout = found
    used = {d["index"]: gpus.used_gib(d) or 0.0 for d in gpus.devices(facts) if "index" in d}
    fullest = max(used[d["index"]] for d in group)
    if rank_weights_gib and rank_weights_gib >= MIN_RANK_GIB and fullest < IDLE_SHARE * rank_weights_gib:
        return _all_idle(group, layout, used, rank_weights_gib, environ)
    idle = [d for d in group if used[d["index"]] < IDLE_SHARE * fullest]
    if len(group) < 2 or fullest < MIN_RANK_GIB or not idle:
        return []
    busy = [d for d in group if d not in idle]
    least = min(used[d["index"]] for d in busy)
    members = {d["index"] for d in group}
    # a GPU outside the group holding a rank's share: where the ranks may be (another numbering)
    elsewhere = [i for i, gib in used.items() if i not in members and gib >= least * (1 - IDLE_SHARE)]
    return _finding(idle, group, layout, used, f"while the other {len(busy)} hold at least {least:.1f} GiB",
                    elsewhere, environ)


def _all_idle(group: list[dict], layout: str, used: dict, weights: float, environ) -> list[Prediction]:
    """Every GPU of the group holds less than a part of one rank's weights: no rank runs there."""
    members = {d["index"] for d in group}
    elsewhere = [i for i, gib in used.items() if i not in members and gib >= weights]
    return _finding(group, group, layout, used, f"while one rank's weights alone take {weights:.1f} GiB",
                    elsewhere, environ)


def _finding(idle: list[dict], group: list[dict], layout: str, used: dict, compared: str, elsewhere: list,
             environ) -> list[Prediction]:
    """The line server-gpu-idle reads: the idle GPUs, what they are compared with, and the GPUs outside the
    group holding a rank's share (where the ranks may be, under another numbering)."""
    line = (f"vllm-doctor health: GPU {_indices(d['index'] for d in idle)} of the server's {len(group)} ({layout} "
            f"on GPUs {_indices(d['index'] for d in group)}) {'holds' if len(idle) == 1 else 'hold'} "
            f"{max(used[d['index']] for d in idle):.1f} GiB {compared}")
    if elsewhere:
        line += f"; GPU {_indices(elsewhere)}, outside them, {'holds' if len(elsewhere) == 1 else 'hold'} " \
                f"{min(used[i] for i in elsewhere):.1f} GiB"
    return [Prediction("server-gpu-idle", line, confidence="high" if environ is not None else "medium")]


def _indices(indices) -> str:
    return ",".join(str(i) for i in indices)
