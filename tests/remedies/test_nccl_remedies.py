"""NCCL remedies on real log lines (the rules' own examples), run through the engine by the remedy_context
fixture (tests/remedies/conftest.py), with facts from the fake NVML machines (the fake_nvml fixture)."""
import pytest

from vllm_doctor.command.edits import DockerOption, SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.remedies import nccl, network


def nvml_facts(machine):
    facts = Facts()
    collect_gpu_facts(facts, machine, environ={})
    return facts


CUSTOM_AR_PEER = ("Failed: Cuda error /w/csrc/custom_all_reduce.cuh:307 "
                  "'peer access is not supported between these two devices'")
RAY_NODE2 = "(RayWorkerWrapper pid=812, ip=10.0.0.2) "
ETH0_HERE = "node-a:55933:55933 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>"


def refused(addr):
    return (f"node-b:812:990 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to {addr} failed : "
            "Connection refused")


def socket_on_node2(ifname, ip):
    return RAY_NODE2 + f"node-b:812:812 [0] NCCL INFO NET/Socket : Using [0]{ifname}:{ip}<0>"


def test_p2p_on_nvlink_box_with_working_p2p_does_not_blame_hardware(fake_nvml, remedy_context):
    ctx = remedy_context("RuntimeError: CUDA error: peer access is not supported between these two devices",
                         facts=nvml_facts(fake_nvml.h100_sxm_x8()), rule="nccl-p2p")
    fix = nccl.fix_p2p(ctx)
    assert SetEnv("NCCL_P2P_DISABLE", "1") not in fix.edits
    assert SetEnv("VLLM_SKIP_P2P_CHECK", "0") in fix.edits
    assert "not the cause" in fix.summary
    assert any("driver" in n for n in fix.notes)
    # the workaround is still offered, as an alternative with its cost
    assert fix.alternatives and SetFlag("--disable-custom-all-reduce") in fix.alternatives[0].edits


def test_p2p_on_pcie_box_without_p2p_disables_custom_allreduce(fake_nvml, remedy_context):
    ctx = remedy_context(CUSTOM_AR_PEER, facts=nvml_facts(fake_nvml.a100_pcie_x3()), rule="nccl-p2p")
    fix = nccl.fix_p2p(ctx)
    assert fix.edits == [SetFlag("--disable-custom-all-reduce")]
    assert "--disable-custom-all-reduce" in fix.summary
    assert "no P2P" in " ".join(fix.arithmetic)
    assert any("slower" in n for n in fix.notes)


def test_p2p_nccl_failure_on_4090_sets_nccl_p2p_disable(fake_nvml, remedy_context):
    ctx = remedy_context("gpu-box:4121:4188 [1] transport/p2p.cc:190 NCCL WARN failed to peer with device 1(=2000): "
                         "217 peer access is not supported between these two devices",
                         facts=nvml_facts(fake_nvml.rtx4090_x2()), rule="nccl-p2p")
    fix = nccl.fix_p2p(ctx)
    assert SetEnv("NCCL_P2P_DISABLE", "1") in fix.edits
    assert "NCCL_P2P_DISABLE=1" in fix.summary


def test_p2p_reads_topology_pasted_in_the_log(remedy_context):
    ctx = remedy_context(["GPU0\t X \tPIX\t0-23\t0\t\tN/A", "GPU1\tPIX\t X \t0-23\t0\t\tN/A", CUSTOM_AR_PEER],
                         rule="nccl-p2p")
    assert ctx.has_pattern("topo-row")
    fix = nccl.fix_p2p(ctx)
    assert "PIX" in " ".join(fix.arithmetic)
    assert any("ACS" in n and "IOMMU" in n for n in fix.notes)  # same switch: BIOS/ACS is the real fix


def test_shm_in_docker_adds_ipc_host(remedy_context):
    ctx = remedy_context("node1:202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend "
                         "/dev/shm/nccl-x to 9637892 bytes", facts={"env.shm_total_bytes": 64 * 1024 * 1024},
                         command="docker run --gpus all vllm/vllm-openai --model m -tp 2", rule="nccl-shm")
    fix = nccl.fix_shm(ctx)
    assert fix.edits == [DockerOption("--ipc", "host")]
    assert DockerOption("--shm-size", "16g") in fix.alternatives[0].edits
    assert "64.0 MiB" in " ".join(fix.arithmetic)
    assert any("/dev/shm/nccl-*" in n for n in fix.notes)  # cleanup is a note, never run


def test_shm_inside_container_without_docker_command(remedy_context):
    ctx = remedy_context("node1:2143:2561 [1] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory "
                         "segment /dev/shm/nccl-H1dBqY (size 7340032)", facts={"env.in_container": True},
                         command="vllm serve m -tp 8", rule="nccl-shm")
    fix = nccl.fix_shm(ctx)
    assert not any(isinstance(e, DockerOption) for e in fix.edits)
    assert "--ipc=host" in fix.summary and SetEnv("NCCL_SHM_DISABLE", "1") in fix.edits


def test_shm_on_bare_metal_falls_back_to_shm_disable(remedy_context):
    ctx = remedy_context("gpu2:2143:2561 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space "
                         "left on device", facts={"env.in_container": False}, command="vllm serve m -tp 2",
                         rule="nccl-shm")
    fix = nccl.fix_shm(ctx)
    assert fix.edits == [SetEnv("NCCL_SHM_DISABLE", "1")]
    assert any("leaked" in n for n in fix.notes)


def test_shm_segment_missing_on_attach_is_not_called_too_small(remedy_context):
    attach = ("a100-8:421780:421780 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory "
              "segment /dev/shm/nccl-ANhRwi (size 192814336), error: No such file or directory (2)")
    fix = nccl.fix_shm(remedy_context(attach, facts={"env.in_container": False}, command="vllm serve m -tp 2",
                                      rule="nccl-shm"))
    assert fix.summary.startswith("The ranks do not share one /dev/shm") and "too small" not in fix.summary
    docker = nccl.fix_shm(remedy_context(attach, facts={"env.in_container": False},
                                         command="docker run --gpus all img -tp 2", rule="nccl-shm"))
    assert "do not share one /dev/shm" in docker.summary


def test_network_pins_the_interface_the_other_nodes_can_reach(remedy_context):
    ctx = remedy_context([refused("172.17.0.1<45613>"), ETH0_HERE, socket_on_node2("docker0", "172.17.0.1")],
                         command="vllm serve m -tp 8 -pp 2", rule="nccl-network")
    fix = network.fix_network(ctx)
    assert SetEnv("NCCL_SOCKET_IFNAME", "eth0") in fix.edits
    assert SetEnv("GLOO_SOCKET_IFNAME", "eth0") in fix.edits
    assert "docker0" in " ".join(fix.notes)
    assert "10.0.0.2" in " ".join(fix.arithmetic)


def test_network_refused_on_routable_interfaces_points_at_a_firewall(remedy_context):
    lines = [refused("10.0.0.2<45613>"), ETH0_HERE, socket_on_node2("eth0", "10.0.0.2")]
    fix = network.fix_network(remedy_context(lines, command="vllm serve m -tp 8 -pp 2", rule="nccl-network"))
    assert "firewall" in " ".join(fix.notes)
    bad = network.fix_network(remedy_context(lines[:2] + [socket_on_node2("docker0", "172.17.0.1")],
                                          command="vllm serve m", rule="nccl-network"))
    assert "firewall" not in " ".join(bad.notes)


def test_network_names_the_failed_connection_from_the_fatal_line_only(remedy_context):
    closed = ("node-a:3341:3390 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer "
              "gpu-h-21<38127>")
    retries = "node-b:812:990 [0] misc/socket.cc:567 NCCL WARN socketStartConnect: exceeded retries (20000)"
    ctx = remedy_context([retries, closed, ETH0_HERE], command="vllm serve m -tp 8 -pp 2", rule="nccl-network")
    assert [m.kind for m in ctx.matches_named("connection-closed-by-peer")] == ["supporting"]
    fix = network.fix_network(ctx)
    assert not any("gpu-h-21<38127>" in a for a in fix.arithmetic)
    ctx = remedy_context([refused("10.0.0.2<45613>"), closed, ETH0_HERE], command="vllm serve m -tp 8 -pp 2",
                         rule="nccl-network")
    assert "connection to 10.0.0.2<45613> failed: Connection refused" in network.fix_network(ctx).arithmetic


def test_network_without_nccl_lines_asks_for_nccl_debug(remedy_context):
    ctx = remedy_context("RuntimeError: Gloo connectFullMesh failed with "
                         "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error", rule="nccl-network")
    fix = network.fix_network(ctx)
    assert SetEnv("NCCL_DEBUG", "INFO") in fix.edits
    assert "GLOO_SOCKET_IFNAME" in fix.summary


def test_network_unique_ip_sets_vllm_host_ip_per_node(remedy_context):
    ctx = remedy_context(["RuntimeError: Every node should have a unique IP address. Got 2 nodes with node ids "
                          "['a1b2', 'c3d4'] and 1 unique IP addresses ['192.168.10.5']. Please check your network "
                          "configuration.",
                          "node-a:55933:55933 [1] NCCL INFO Bootstrap : Using ens3:192.168.10.5<0>"],
                         rule="nccl-network")
    fix = network.fix_network(ctx)
    assert SetEnv("VLLM_HOST_IP", "192.168.10.5") in fix.edits
    assert "VLLM_HOST_IP" in fix.summary


def test_watchdog_timeout_reruns_with_nccl_debug(remedy_context):
    ctx = remedy_context("[rank1]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught "
                         "collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                         "Timeout(ms)=600000) ran for 600049 milliseconds before timing out.", rule="nccl-timeout")
    fix = nccl.fix_timeout(ctx)
    assert fix.edits == [SetEnv("NCCL_DEBUG", "INFO")]
    assert "ALLREDUCE #3 waited 600 s (timeout 600 s)" in fix.arithmetic[0]


def test_engine_core_timeout_raises_ready_timeout(remedy_context):
    ctx = remedy_context("TimeoutError: Timed out waiting for engine core processes to start. This is often caused "
                         "by slow weight loading for large models. Waited 600s (configured by "
                         "VLLM_ENGINE_READY_TIMEOUT_S).", rule="nccl-timeout")
    assert SetEnv("VLLM_ENGINE_READY_TIMEOUT_S", "1800") in nccl.fix_timeout(ctx).edits


# real (vllm#32116, DP API servers while DeepGEMM warm-up ran past 600 s); 0.9.1-0.16's wording of the same wait
HANDSHAKE = ("(ApiServer_2 pid=39384) TimeoutError: Timed out waiting for engines to sendinitial message on input "
             "socket.")


def test_the_engines_handshake_wait_is_raised_where_the_version_has_the_variable(remedy_context):
    fix = nccl.fix_timeout(remedy_context(HANDSHAKE, rule="nccl-timeout"))
    assert SetEnv("VLLM_ENGINE_READY_TIMEOUT_S", "1800") in fix.edits
    assert any("from vLLM 0.15" in n for n in fix.notes)        # the version is unknown: say where it exists
    newer = "INFO 01-11 10:00:00 [api_server.py:1885] vLLM API server version 0.15.1\n" + HANDSHAKE
    fix = nccl.fix_timeout(remedy_context(newer, rule="nccl-timeout"))
    assert fix.edits == [SetEnv("VLLM_ENGINE_READY_TIMEOUT_S", "1800")]
    assert not any("0.15" in n for n in fix.notes)


def test_the_engines_handshake_wait_is_fixed_before_the_variable_existed(remedy_context):
    older = "INFO 01-11 10:00:00 [api_server.py:1885] vLLM API server version 0.10.2\n" + HANDSHAKE
    fix = nccl.fix_timeout(remedy_context(older, rule="nccl-timeout"))
    assert not any(isinstance(e, SetEnv) and e.name == "VLLM_ENGINE_READY_TIMEOUT_S" for e in fix.edits)
    assert "fixed 600 s" in fix.summary and "0.10.2" in fix.summary


@pytest.mark.parametrize("err, hint", [("unhandled system error", "/dev/shm"), ("unhandled cuda error", "P2P")])
def test_generic_names_the_usual_suspect(err, hint, remedy_context):
    ctx = remedy_context("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                         f"NCCLUtils.hpp:268, {err} (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
                         rule="nccl-generic")
    fix = nccl.fix_generic(ctx)
    assert fix.edits == [SetEnv("NCCL_DEBUG", "INFO")]
    assert "NCCL_DEBUG=INFO" in fix.summary
    assert any(hint in n for n in fix.notes)


IB_FATAL = ("node-b:812:1010 [2] transport/net_ib/common.cc:123 NCCL WARN NET/IB : mlx5_1:1 async fatal event: "
            "local catastrophic error")


def test_an_ib_card_that_failed_is_checked_and_left_out_not_a_socket_interface(remedy_context):
    """NCCL's async event thread saw the HCA fail (IBV_EVENT_DEVICE_FATAL): the card or its link is the cause;
    pinning socket interfaces would change nothing."""
    from vllm_doctor.command.edits import SetEnv
    from vllm_doctor.remedies.network import fix_network

    fix = fix_network(remedy_context(IB_FATAL, rule="nccl-network"))
    assert fix.edits == [SetEnv("NCCL_IB_HCA", "^mlx5_1")]
    assert "mlx5_1" in fix.summary and "ibstat" in fix.summary
    assert fix.arithmetic == ["InfiniBand mlx5_1:1: local catastrophic error"]
    assert any(SetEnv("NCCL_IB_DISABLE", "1") in a.edits for a in fix.alternatives)


def test_an_ib_fault_beside_a_failed_socket_connect_keeps_the_interface_fix(remedy_context):
    from vllm_doctor.remedies.network import fix_network

    connect = ("node-b:812:990 [0] misc/socket.cc:630 NCCL WARN socketPollConnect: Connect to 10.0.0.7<38719> "
               "returned 113(No route to host) errno 113(No route to host)")
    fix = fix_network(remedy_context([connect, IB_FATAL], rule="nccl-network"))
    assert not fix.summary.startswith("Check the InfiniBand")
    # beside another IB error (the peer's completion in error) it is still the card, not a socket interface
    completion = ("node-a:100:150 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4711> with "
                  "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND len=0 vendor_err=129 hca mlx5_0")
    both = fix_network(remedy_context([IB_FATAL, completion], rule="nccl-network"))
    assert both.summary.startswith("Check the InfiniBand device mlx5_1")


def test_a_timeout_seen_only_through_the_watchdogs_later_lines(diagnose):
    """A paste that starts after the watchdog's first line: PyTorch prints "Timeout at NCCL work" only for a
    timed-out collective, and the dump signal names the rank that timed out first."""
    lines = ["[rank6]:[E703 21:51:54.112142364 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
             "Received a dump signal due to a collective timeout from  rank 7 and we will try our best to dump the "
             "debug info. Last enqueued NCCL work: 56116, last completed NCCL work: 56116.",
             "[rank6]:[E703 21:51:54.2 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 6] Timeout at NCCL work: "
             "56117, last enqueued NCCL work: 56117, last completed NCCL work: 56116."]
    d = diagnose("\n".join(lines))
    top = d.findings[0]
    assert top.rule == "nccl-timeout"
    assert "collective #56117 timed out; the last one completed was #56116" in top.fix.arithmetic
    assert any("rank 7" in n for n in top.fix.notes)
    # the watchdog's options line at start-up is no timeout
    assert diagnose("[rank0]:[I1003 18:07:01.8 ProcessGroupNCCL.cpp:1016] [PG 0 (default_pg) Rank 0] "
                    "ProcessGroupNCCL initialization options: size: 2, global rank: 0, TIMEOUT(ms): 600000").findings == []


IB_REG_MR = "node-a:2201:2290 [0] misc/ibvwrap.cc:122 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory"


def test_ib_memory_registration_out_of_memory_is_the_memlock_limit(diagnose):
    """NCCL pins the buffers it sends from over InfiniBand: ibv_reg_mr's ENOMEM is the locked-memory limit (a
    container keeps 64 KiB unless raised), not the sockets or the card."""
    from vllm_doctor.command.edits import DockerOption

    d = diagnose(IB_REG_MR, command="docker run --gpus all vllm/vllm-openai --model m -tp 8")
    f = d.findings[0]
    assert f.rule == "nccl-network" and f.fix.edits == [DockerOption("--ulimit", "memlock=-1")]
    assert "--ulimit memlock=-1" in f.fix_command and "NCCL_SOCKET_IFNAME" not in f.fix_command
    bare = diagnose(IB_REG_MR, command="vllm serve m -tp 8").findings[0]
    assert bare.fix.edits == [] and "ulimit -l unlimited" in bare.fix.summary
    # another verbs failure is the devices' state: no memlock advice
    other = diagnose(IB_REG_MR.replace("ibv_reg_mr", "ibv_query_gid").replace("Cannot allocate memory",
                                                                             "Invalid argument errno 22"))
    assert "ibv_devinfo" in other.findings[0].fix.summary and "ulimit" not in other.findings[0].fix.summary


ZMQ_BIND = "zmq.error.ZMQError: Cannot assign requested address (addr='tcp://172.17.0.5:34762')"


@pytest.mark.parametrize("frame, setting", [
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py", "VLLM_NIXL_SIDE_CHANNEL_HOST"),
    ("vllm/v1/engine/coordinator.py", "--data-parallel-address"),
    ("vllm/v1/engine/core.py", "VLLM_HOST_IP")])
def test_an_address_the_node_does_not_have_names_the_setting_that_gave_it(diagnose, frame, setting):
    """ZMQ's EADDRNOTAVAIL on bind: the address configured for this node is another's. The frames say which
    setting names it; no value is written into the launch command (vLLM's Ray executor copies it to every
    worker, where the one node's address is wrong again); a busy port stays port-in-use's."""
    tb = ["(RayWorkerWrapper pid=438, ip=172.17.0.6) Traceback (most recent call last):",
          f'(RayWorkerWrapper pid=438, ip=172.17.0.6)   File "/usr/lib/python3/dist-packages/{frame}", line 409, in bind',
          "(RayWorkerWrapper pid=438, ip=172.17.0.6)     with zmq_ctx(zmq.ROUTER, path) as sock:", ZMQ_BIND]
    d = diagnose("\n".join(tb))
    assert [f.rule for f in d.findings] == ["nccl-network"]
    fix = d.findings[0].fix
    assert setting in fix.summary and "172.17.0.6" in fix.summary and not fix.edits
    busy = diagnose(ZMQ_BIND.replace("Cannot assign requested address", "Address already in use"))
    assert [f.rule for f in busy.findings] != ["nccl-network"]


RAY_IP_UNMATCHED = ("RuntimeError: This node has an IP address of 172.17.0.2, and Ray expects this IP address to be "
                    "either the GCS address or one of the Raylet addresses. Connected to GCS at 10.0.0.1 and found "
                    "raylets at 10.0.0.1, 10.0.0.2 but none of these match this node's IP 172.17.0.2. Are any of "
                    "these actually a different IP address for the same node?You might need to provide "
                    "--node-ip-address to specify the IP address that the head should use when sending to this node.")


def test_a_ray_driver_without_its_node_runs_vllm_where_ray_started(remedy_context):
    fix = network.fix_network(remedy_context(RAY_IP_UNMATCHED, command="vllm serve m -tp 8 -pp 2",
                                             rule="nccl-network"))
    assert "ray start --node-ip-address=172.17.0.2" in fix.summary
    assert "172.17.0.2" in fix.arithmetic[0] and "10.0.0.1, 10.0.0.2" in fix.arithmetic[0]
    assert "bridge" in " ".join(fix.notes)
    # no interface was named by NCCL: the driver's node is the fix, not NCCL_SOCKET_IFNAME
    assert not any(isinstance(e, SetEnv) and e.name == "NCCL_SOCKET_IFNAME" for e in fix.edits)


def test_rays_info_line_that_falls_back_to_the_head_is_not_a_finding(diagnose):
    info = ("[2023-05-10 22:52:47,666 I 108 108] global_state_accessor.cc:356: This node has an IP address of "
            "10.244.0.56, but we cannot find a local Raylet with the same address. This can happen when you connect "
            "to the Ray cluster with a different IP address or when connecting to a container.")
    assert diagnose([info, "INFO 06-01 10:00:00 [api_server.py:1] Application startup complete."]).findings == []
