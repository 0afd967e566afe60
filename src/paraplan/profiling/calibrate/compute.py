"""`paraplan calibrate`'s compute and links (profiling/calibrate/): reference models profiled layer by
layer on one core with the other cores idle and while they train the same model ("loaded", as a
training run keeps every core busy), a whole step's slowdown under that load, and gloo's ping-pong
idle and loaded. `CoresLoaded` is the load: busy processes for the length of a `with` block.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable

from paraplan.errors import ParaplanError

BATCH_SIZES = (4, 16, 32)
LINK_MAX_BYTES = 16 * 2**20  # the tiny models' activations are KiBs to MiBs


def _busy_model(model: str, ready, stop, go) -> None:
    """A loaded core: training steps of `model` on one thread while `go` is set, until `stop`."""
    import torch

    from paraplan.models import source

    torch.set_num_threads(1)
    built = source.build(model, device="cpu", seed=1)
    built.module.train()
    layers = [m for _, _, m in built.layers()]
    x, y = built.batch(16, seed=1)
    ready.set()
    while not stop.is_set():
        if not go.wait(0.05):
            continue
        h = x
        for layer in layers:
            h = layer(h)
        built.loss(h, y).backward()


def _busy_matmul(ready, stop, go) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    ready.set()
    while not stop.is_set():
        if go.wait(0.05):
            a = torch.tanh(a @ a)


class CoresLoaded:
    """`n` busy processes for the duration of a `with` block (from the warm forkserver, or spawned
    with PARAPLAN_START_METHOD=spawn: either way no inherited threads);
    `pause()` / `resume()` idle them without the cost of starting them again."""

    def __init__(self, n: int, model: str | None = None):
        self.n, self.model = n, model

    def __enter__(self):
        from paraplan.system.processes import start_method

        ctx = multiprocessing.get_context(start_method())
        self.stop, self.go = ctx.Event(), ctx.Event()
        self.go.set()
        self.procs = []
        for _ in range(self.n):
            ready = ctx.Event()
            args = (self.model, ready, self.stop, self.go) if self.model else (ready, self.stop, self.go)
            p = ctx.Process(target=_busy_model if self.model else _busy_matmul, args=args, daemon=True)
            p.start()
            if not ready.wait(120):
                raise ParaplanError("calibrate: a load process did not start")
            self.procs.append(p)
        time.sleep(0.5)  # let the loads reach their steady state
        return self

    def pause(self):
        self.go.clear()
        time.sleep(0.2)

    def resume(self):
        self.go.set()
        time.sleep(0.2)

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        return False


def measure_compute(models, cores: int, repeats: int, progress: Callable[[str], None]):
    """Per reference model: (ModelSpec, idle Profile, loaded Profile)."""
    import torch

    from paraplan.models import measure, source
    from paraplan.profiling.profiler import run_profile, workload

    out = []
    for model in models:
        work = workload(model, torch.device("cpu"))
        spec = measure.measure(source.build(model, device="meta"))
        progress(f"compute: profiling {model} with the other cores idle")
        idle = run_profile(work, torch.device("cpu"), list(BATCH_SIZES), 1, 3, repeats, step_check=False,
                           repeat_check=False)
        progress(f"compute: profiling {model} while {cores - 1} other core(s) train it too")
        with CoresLoaded(cores - 1, model) as load:
            loaded = run_profile(work, torch.device("cpu"), list(BATCH_SIZES), 1, 3, repeats, step_check=False,
                                 repeat_check=False)
            progress(f"compute: {model}'s training step with the other cores idle and busy, interleaved")
            ratio = _contention(work, load)
        out.append((spec, idle, loaded, ratio))
    return out


def _contention(work, load, blocks: int = 4, steps: int = 5) -> float:
    """A whole training step's time with the other cores busy over with them idle, in alternating
    blocks (idle, busy, idle, busy, ...) so that the machine's drift hits both alike."""
    import torch

    layers = [m for _, _, m in work.layers]
    x, y = work.make_batch(BATCH_SIZES[-1])

    def step() -> float:
        t0 = time.perf_counter()
        h = x
        for layer in layers:
            h = layer(h)
        work.loss(h, y).backward()
        return time.perf_counter() - t0

    torch.set_num_threads(1)
    idle, busy = [], []
    for _ in range(blocks):
        load.pause()
        step()
        idle += [step() for _ in range(steps)]
        load.resume()
        step()
        busy += [step() for _ in range(steps)]
    return statistics.median(busy) / statistics.median(idle)


def measure_links(nproc: int, progress: Callable[[str], None]):
    from paraplan.profiling.links import profile_links

    progress(f"links: gloo ping-pong between {nproc} processes, idle")
    idle = profile_links("gloo", nproc, LINK_MAX_BYTES)
    progress("links: the same while every core also computes")
    with CoresLoaded(nproc):
        loaded = profile_links("gloo", nproc, LINK_MAX_BYTES)
    return idle, loaded
