"""Loopback networking shared by the processes paraplan starts (profile-links, train)."""

from __future__ import annotations

import random
import socket

# where the kernel takes the local ports of outgoing connections when it has no range to read
DEFAULT_EPHEMERAL = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections (Linux's
    ip_local_port_range; the default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a rendezvous, outside the ephemeral range. A port the
    kernel hands out for bind(0), released here and bound by rank 0 a second later, may meanwhile
    become the local end of any outgoing connection (gloo's own, another run's): the rendezvous
    then fails with EADDRINUSE (seen once in the test suite, where two workers launch ranks side by
    side). Below (or above) the range only another listener can take it, and a random choice makes
    two launches picking the same port unlikely."""
    low, high = ephemeral_range()
    below, above = range(max(1024, low - 16384), low), range(high + 1, 65536)
    ports = below if len(below) >= len(above) else above
    chooser = random.SystemRandom()
    for _ in range(100):
        port = chooser.choice(ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every try taken: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
