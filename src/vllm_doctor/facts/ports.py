"""Ports on this machine, probed read-only: which are listening (/proc/net/tcp*), and whether one could be
bound now (a socket bound and closed at once; nothing is left open)."""
from __future__ import annotations

import socket


def _listening_ports(paths=("/proc/net/tcp", "/proc/net/tcp6")) -> set[int] | None:
    ports: set[int] = set()
    found = False
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":          # TCP_LISTEN
                try:
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
                except (IndexError, ValueError):
                    continue
    return ports if found else None


def port_in_use(port: int) -> bool | None:
    """True/False from /proc/net/tcp*; None when that cannot be read (not Linux)."""
    ports = _listening_ports()
    return None if ports is None else port in ports


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True
