"""Remedies for a port that is already taken (rules/port-in-use.toml): the HTTP server's own --port, or a port
vLLM or torch.distributed binds for itself (ZMQ messaging, the TCPStore rendezvous), which --port never moves."""
from __future__ import annotations

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.facts.ports import port_free
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.numbers import as_int
from vllm_doctor.remedies.context import RemedyContext


def _free_port_after(port: int, live: bool, gap: int = 1) -> int:
    """`port + gap`, or when the doctor runs on the machine itself the first free port from there."""
    if live:
        for cand in range(port + gap, min(port + gap + 50, 65536)):
            if port_free(cand):
                return cand
    return port + gap


def _port_socket(ctx: RemedyContext) -> str:
    """Which socket failed: the HTTP server's (errno/uvicorn), torch.distributed's TCPStore, or ZMQ."""
    return "tcpstore" if ctx.has_pattern("tcpstore", "tcpstore-bind") else "zmq" if ctx.has_pattern("zmq") else "http"


def fix_port_in_use(ctx: RemedyContext) -> Fix | None:
    live = bool(ctx.fact("doctor.live"))
    kind = _port_socket(ctx)
    if kind != "http":
        return _fix_internal_port(ctx, kind, live)
    port = ctx.capture_int("port") or ctx.arg_int("port") or 8000
    new = _free_port_after(port, live)
    summary = f"Use --port {new}: port {port} is taken"
    manifest = ctx.command.manifest if ctx.command is not None else None
    if manifest == "kubernetes":     # the pod's other references to the port are in the same manifest
        summary += (f"; in the same manifest move containerPort {port} -> {new}, the Service's targetPort and the "
                    f"liveness/readiness probes' port with it")
    elif ctx.is_docker and "host" not in ctx.command.docker_values("--network"):    # host network: nothing published
        summary += f"; publish the new one (-p {new}:{new}, or ports: in compose)"
    return Fix(summary, [SetFlag("--port", str(new))],
               alternatives=[Alternative(f"Stop the process listening on port {port} (`ss -ltnp 'sport = :{port}'` or "
                                         f"`lsof -i :{port}`) and keep --port {port}", [], "stopping another service")],
               notes=["Clients and any -p host:container mapping must use the new port; in Kubernetes also the "
                      "containerPort, the Service's targetPort and the probes' port."],
               facts_used={"port": port, "new_port": new, "checked_free_here": live})


def _fix_zmq_port(ctx: RemedyContext, port: int | None, live: bool, stop: Alternative, notes: list[str],
                  facts_used: dict) -> Fix:
    facts_used["socket"] = "vLLM ZMQ messaging"
    rpc = ctx.flag("--data-parallel-rpc-port")
    dp = ctx.arg_int("data_parallel_size") or 1
    if port and (str(port) == rpc or (rpc is None and port == 29550 and dp > 1)):
        new = _free_port_after(port, live)
        return Fix(f"Use --data-parallel-rpc-port {new}: the data-parallel handshake port {port} is taken",
                   [SetFlag("--data-parallel-rpc-port", str(new))], alternatives=[stop],
                   notes=notes + ["Every node of the deployment must be given the same --data-parallel-rpc-port."],
                   facts_used=facts_used)
    if port and ctx.env("VLLM_RPC_PORT") == str(port):
        new = _free_port_after(port, live)
        return Fix(f"Set VLLM_RPC_PORT={new}: the RPC port {port} is taken", [SetEnv("VLLM_RPC_PORT", str(new))],
                   alternatives=[stop], notes=notes, facts_used=facts_used)
    return Fix(stop.summary, [], notes=notes, facts_used=facts_used)


def _fix_internal_port(ctx: RemedyContext, kind: str, live: bool) -> Fix:
    """A port vLLM or torch binds for itself (rule explanation, cases 2 and 3): never `--port`."""
    port = ctx.capture_int("port")
    where = f"port {port}" if port else "the port"
    http = ctx.arg("port")
    stop = Alternative(f"Stop the process that holds {where}"
                       + (f" (`ss -ltnp 'sport = :{port}'`)" if port else " (`ss -ltnp`)")
                       + ": often an earlier vLLM or torchrun that did not exit", [], "stopping that process")
    facts_used = {"port": port, "http_port": http, "checked_free_here": live}
    notes = [f"--port{f' {http}' if http else ''} is the HTTP port and is not the one that clashed: leave it."]
    if kind == "zmq":
        return _fix_zmq_port(ctx, port, live, stop, notes, facts_used)
    facts_used["socket"] = "torch.distributed init (TCPStore)"
    if (ctx.arg_int("nnodes") or 1) > 1:
        new = _free_port_after(port or 29501, live)
        return Fix(f"Use --master-port {new} on every node: the distributed init port {where} is taken",
                   [SetFlag("--master-port", str(new))], alternatives=[stop], notes=notes, facts_used=facts_used)
    if ctx.arg("distributed_executor_backend") == "external_launcher":
        new = _free_port_after(port or 29500, live)
        return Fix(f"Set MASTER_PORT={new} for torchrun: the distributed init port {where} is taken",
                   [SetEnv("MASTER_PORT", str(new))], alternatives=[stop], notes=notes, facts_used=facts_used)
    # One node: vLLM picked the port itself (VLLM_PORT and upwards when set), and another instance starting
    # at the same moment, or a leftover process, took it before torch bound it.
    base = as_int(ctx.env("VLLM_PORT"))
    new = _free_port_after(base if base is not None else (port or 29500), live, gap=100)
    facts_used["VLLM_PORT"] = base
    why = (f"VLLM_PORT={base} is shared with another instance" if base is not None
           else "another instance starting at the same time, or a leftover process, took the port vLLM picked")
    return Fix(f"Set VLLM_PORT={new} for this instance: {where} for torch.distributed was taken ({why})",
               [SetEnv("VLLM_PORT", str(new))], alternatives=[stop],
               notes=notes + ["Start several instances one after another, or give each its own VLLM_PORT a few dozen "
                              "ports apart: vLLM takes its internal ports from VLLM_PORT upwards."],
               facts_used=facts_used)
