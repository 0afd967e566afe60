"""`paraplan profile-links`: measure point-to-point and all-reduce costs between real processes
and fit alpha + bytes / beta (FD-DPS Definition 4) by linear regression.

The ranks are started here with torch.multiprocessing on 127.0.0.1 (gloo on the CPU, nccl on
GPUs). Point-to-point time is half a ping-pong round trip between rank 0 and rank 1; all-reduce
time is the slowest rank's. Sizes go from 1 KiB to 256 MiB in steps of 4x; small messages get
more repeats. The fit weights each size by 1 / time, so the latency of small messages counts as
much as the bandwidth of large ones.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.errors import FieldError
from paraplan.system.localnet import free_port


@dataclass(frozen=True)
class LinkFit:
    latency_s: float  # alpha
    bandwidth_bytes_per_s: float  # beta
    r_squared: float


@dataclass(frozen=True)
class LinkProfile:
    backend: str
    nproc: int
    sizes: tuple[int, ...]
    p2p_s: tuple[float, ...]  # medians
    p2p_spread: tuple[float, ...]  # (max - min) / median
    allreduce_s: tuple[float, ...]
    p2p: LinkFit
    allreduce: LinkFit


def fit_alpha_beta(sizes, seconds) -> LinkFit:
    """Least squares of t = alpha + n / beta, weighted by 1 / t (relative errors)."""
    x, y = np.asarray(sizes, float), np.asarray(seconds, float)
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    if slope <= 0:
        # Noise on latency-bound sizes can tilt the line down; the best throughput observed still
        # bounds the bandwidth from above, so use it and refit the latency alone.
        slope = float(np.min(y / x))
        intercept = float(np.average(y - slope * x, weights=1.0 / y))
    pred = intercept + slope * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    return LinkFit(latency_s=max(0.0, float(intercept)), bandwidth_bytes_per_s=1.0 / max(float(slope), 1e-15),
                   r_squared=1.0 - ss_res / ss_tot)


def default_sizes(max_bytes: int) -> list[int]:
    sizes, n = [], 1024
    while n <= max_bytes:
        sizes.append(n)
        n *= 4
    return sizes


def _repeats(nbytes: int) -> int:
    return int(max(3, min(40, 64e6 / nbytes)))


def _worker(rank: int, nproc: int, backend: str, port: int, sizes: list[int], out_path: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=nproc)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)

    def sync():
        if backend == "nccl":
            torch.cuda.synchronize(device)

    p2p, allreduce = {}, {}
    for nbytes in sizes:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        samples = []
        for r in range(_repeats(nbytes) + 2):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync()
            if r >= 2:
                samples.append((time.perf_counter() - t0) / 2)
        p2p[nbytes] = samples
        samples = []
        for r in range(_repeats(nbytes) + 2):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync()
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if r >= 2:
                samples.append(float(elapsed.item()))
        allreduce[nbytes] = samples
    if rank == 0:
        from paraplan.system.fileio import atomic_write_text  # a full disk: one line

        atomic_write_text(out_path, json.dumps({"p2p": p2p, "allreduce": allreduce}))
    dist.barrier()
    dist.destroy_process_group()


RANK_BASE_BYTES = 400 * 2**20  # a rank before its buffers: ~230 MiB resident measured (torch, gloo up), with room


def buffer_bytes_per_rank(largest_message_bytes: int) -> int:
    """Each rank's message buffer, and as much again for the collective's working copy (gloo's ring
    all-reduce reduces into a second buffer of the message's size)."""
    return 2 * largest_message_bytes


def check_buffers_fit(backend: str, nproc: int, largest_message_bytes: int) -> None:
    """FieldError naming max_bytes (or nproc) when the ranks' buffers would not fit in this machine's
    available memory: checked before any process starts, so a size of 10**12 ends in one line
    instead of every rank allocating until the kernel kills it. nccl's buffers live on the GPUs."""
    from paraplan.system.host import available_memory_bytes, gib

    per_rank = buffer_bytes_per_rank(largest_message_bytes)
    if backend == "nccl":
        import torch

        for device in range(nproc):
            free, _ = torch.cuda.mem_get_info(device)
            if per_rank > free:
                raise FieldError("max_bytes", f"messages up to {largest_message_bytes:,} bytes need {gib(per_rank)} "
                                              f"on each GPU; GPU {device} has {gib(free)} free")
        return
    available = available_memory_bytes()
    if available is None:
        return
    need = nproc * (RANK_BASE_BYTES + per_rank)
    if need <= available:
        return
    if nproc * RANK_BASE_BYTES > available:
        raise FieldError("nproc", f"{nproc} processes need ~{gib(nproc * RANK_BASE_BYTES)} before any message "
                                  f"({gib(RANK_BASE_BYTES)} each); this machine has {gib(available)} of memory "
                                  f"available")
    largest_fitting = (available // nproc - RANK_BASE_BYTES) // 2
    raise FieldError("max_bytes", f"messages up to {largest_message_bytes:,} bytes need {gib(per_rank)} of buffers in "
                                  f"each of {nproc} processes, {gib(need)} in all with the processes themselves; this "
                                  f"machine has {gib(available)} of memory available: at most "
                                  f"{max(0, largest_fitting):,} bytes")


def profile_links(backend: str = "gloo", nproc: int = 2, max_bytes: int = 256 * 2**20) -> LinkProfile:
    import torch
    import torch.multiprocessing as mp

    from paraplan.system.processes import start_method

    if backend not in ("gloo", "nccl"):
        raise FieldError("backend", f"expected gloo or nccl, got {backend!r}")
    if nproc < 2:
        raise FieldError("nproc", f"need at least 2 processes, got {nproc}")
    if backend == "nccl" and torch.cuda.device_count() < nproc:
        raise FieldError("backend", f"nccl needs {nproc} GPUs, this machine has {torch.cuda.device_count()}")
    if max_bytes < 1024:
        raise FieldError("max_bytes", f"must be at least 1024, got {max_bytes}")
    sizes = default_sizes(max_bytes)
    check_buffers_fit(backend, nproc, sizes[-1])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "links.json")
        # from the warm forkserver the ranks of a plan start from (system/processes.py), not fresh
        # interpreters: 4-8 s of a core each here, twice per `calibrate`
        mp.start_processes(_worker, args=(nproc, backend, free_port(), sizes, out), nprocs=nproc, join=True,
                           start_method=start_method())
        data = json.loads(Path(out).read_text())
    p2p = [statistics.median(data["p2p"][str(n)]) for n in sizes]
    spread = [(max(data["p2p"][str(n)]) - min(data["p2p"][str(n)])) / statistics.median(data["p2p"][str(n)])
              for n in sizes]
    allreduce = [statistics.median(data["allreduce"][str(n)]) for n in sizes]
    return LinkProfile(backend=backend, nproc=nproc, sizes=tuple(sizes), p2p_s=tuple(p2p), p2p_spread=tuple(spread),
                       allreduce_s=tuple(allreduce), p2p=fit_alpha_beta(sizes, p2p),
                       allreduce=fit_alpha_beta(sizes, allreduce))
