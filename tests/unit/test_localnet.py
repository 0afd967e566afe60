"""The rendezvous port is free and outside the kernel's ephemeral range (system/localnet.py): a
port from that range, released and bound a second later by rank 0, was once taken meanwhile by an
outgoing connection and the launch failed with EADDRINUSE."""

import socket

from paraplan.system.localnet import ephemeral_range, free_port


def test_rendezvous_ports_are_free_and_never_ephemeral():
    low, high = ephemeral_range()
    assert 1024 <= low <= high <= 65535
    ports = [free_port() for _ in range(50)]
    assert all(not low <= p <= high for p in ports), ports
    assert len(set(ports)) > 40  # random, so two launches side by side do not pick the same
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free for rank 0
