"""This machine's network identity: hostname and the IPv4 address of each interface.

What NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME must name (an interface that exists, on every node) and what
VLLM_HOST_IP must be unique against. Standard library only: SIOCGIFADDR on each name of if_nameindex()
(Linux); elsewhere the names without addresses.
"""
from __future__ import annotations

import socket
import struct

SIOCGIFADDR = 0x8915


def _ipv4(name: str) -> str | None:
    try:
        import fcntl
    except ImportError:          # not on POSIX
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:         # an interface without an IPv4 address
            return None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> dict[str, str | None]:
    """{interface name: its IPv4 address or None}, in the kernel's order."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return {}
    return {name: _ipv4(name) for name in names}


def collect_network_facts(facts) -> None:
    facts.set("net.hostname", socket.gethostname(), "env")
    facts.set("net.interfaces", interfaces(), "env")
