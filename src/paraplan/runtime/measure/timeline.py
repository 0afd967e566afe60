"""What each rank really did and when: forward and backward of each micro-batch, the waits on
point-to-point transfers, and gradient all-reduces; written per rank, merged into a Chrome trace
and drawn beside the simulated timeline.

The compute spans come from wrapping the stage's forward_one_chunk / backward_one_chunk. Sends
and receives are asynchronous inside torch.distributed.pipelining; what a rank experiences is the
wait on them, so the schedule module's `_batch_p2p` / `_wait_batch_p2p` are wrapped (private
names of the pipelining package, kept behind this one adapter; torch versions move them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class Recorder:
    def __init__(self):
        self.events: list[dict] = []
        self.step = 0
        self.enabled = True

    def add(self, lane: str, kind: str, micro: int, start: float, end: float) -> None:
        if self.enabled:
            self.events.append({"step": self.step, "lane": lane, "kind": kind, "micro": micro, "start": start,
                                "end": end})

    def wrap_stage(self, stage) -> None:
        # the class's functions and a weak reference, not the stage's bound methods: those make
        # stage -> wrapper -> stage a cycle that gc.collect() was seen not to free after FSDP2 runs,
        # so the stage's modules, DTensors and meshes outlived the process group (runtime/launcher/teardown.py)
        import weakref

        fwd, bwd, ref = type(stage).forward_one_chunk, type(stage).backward_one_chunk, weakref.ref(stage)

        def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
            t0 = time.time()
            out = fwd(ref(), fwd_chunk_id, *args, **kwargs)
            self.add("compute", "forward", fwd_chunk_id, t0, time.time())
            return out

        def backward_one_chunk(bwd_chunk_id, *args, **kwargs):
            t0 = time.time()
            out = bwd(ref(), bwd_chunk_id, *args, **kwargs)
            self.add("compute", "backward", bwd_chunk_id, t0, time.time())
            return out

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk

    def patch_p2p(self) -> None:
        import torch.distributed.pipelining.schedules as schedules

        batch, wait = schedules._batch_p2p, schedules._wait_batch_p2p
        recorder = self

        def _batch_p2p(p2p_ops, desc=None):
            works = batch(p2p_ops, desc=desc) if desc is not None else batch(p2p_ops)
            for w in works:
                try:
                    w._paraplan = (desc or "p2p", time.time())
                except AttributeError:
                    pass
            return works

        def _wait_batch_p2p(work):
            t0 = time.time()
            wait(work)
            desc = next((getattr(w, "_paraplan", ("p2p", t0))[0] for w in work), "p2p")
            recorder.add("comm", desc, -1, t0, time.time())

        schedules._batch_p2p = _batch_p2p
        schedules._wait_batch_p2p = _wait_batch_p2p

    def save(self, path: str | Path, rank: int) -> None:
        from paraplan.system.fileio import atomic_write_text

        atomic_write_text(path, json.dumps({"rank": rank, "events": self.events}))


def load_runs(out_dir: str | Path) -> dict[int, list[dict]]:
    runs = {}
    for f in sorted(Path(out_dir).glob("timeline_rank*.json")):
        data = json.loads(f.read_text())
        runs[int(data["rank"])] = data["events"]
    return runs


def one_step(runs: dict[int, list[dict]], step: int) -> dict[int, list[dict]]:
    """The events of one step, times relative to that step's first event on any rank."""
    picked = {r: [e for e in ev if e["step"] == step] for r, ev in runs.items()}
    t0 = min((e["start"] for ev in picked.values() for e in ev), default=0.0)
    return {r: [{**e, "start": e["start"] - t0, "end": e["end"] - t0} for e in ev] for r, ev in picked.items()}


def measured_trace(runs: dict[int, list[dict]], path: str | Path) -> None:
    from paraplan.system.fileio import atomic_write_text

    tids = {"compute": 0, "comm": 1, "allreduce": 2}
    t0 = min((e["start"] for ev in runs.values() for e in ev), default=0.0)
    events = []
    for rank, ev in runs.items():
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        for lane, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}})
        for e in ev:
            events.append({"name": f"{e['kind']} {e['micro']}" if e["micro"] >= 0 else e["kind"], "ph": "X",
                           "cat": e["kind"], "pid": rank, "tid": tids[e["lane"]], "ts": (e["start"] - t0) * 1e6,
                           "dur": (e["end"] - e["start"]) * 1e6, "args": {"step": e["step"]}})
    atomic_write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def side_by_side(step_events: dict[int, list[dict]], simulated, path: str | Path, title: str, *,
                 measured_s: float, measured_label: str, predicted_s: float) -> None:
    """Measured (top) and simulated (bottom) timelines of one iteration on the same time axis.

    Each panel ends at the number in its title: the measured step's time (`measured_s`, the
    slowest rank's) and the predicted iteration (`predicted_s`); the part of each that lies outside
    the drawn schedule (optimizer, zeroing gradients, the loss all-reduce; the per-step overhead
    in the prediction) is the hatched band at its end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from paraplan.simulator.export import COLOURS
    from paraplan.system.fileio import atomic_write

    colours = {**COLOURS, "comm": "#DD8452", "allreduce": "#8172B3"}
    outside = {"facecolor": "#DDDDDD", "edgecolor": "#999999", "hatch": "//", "linewidth": 0}
    ranks = sorted(step_events)
    measured_end = max((e["end"] for ev in step_events.values() for e in ev), default=0.0)
    span = max(measured_end, measured_s, simulated.makespan, predicted_s)
    fig, axes = plt.subplots(2, 1, figsize=(12, 1.2 * len(ranks) + 3.2), sharex=True)
    for i, r in enumerate(ranks):
        for e in step_events[r]:
            y0, h = (i - 0.3, 0.6) if e["lane"] == "compute" else (i + 0.32, 0.18)
            kind = e["kind"] if e["lane"] == "compute" else ("allreduce" if e["lane"] == "allreduce" else "comm")
            axes[0].broken_barh([(e["start"], e["end"] - e["start"])], (y0, h), facecolors=colours.get(kind, "grey"),
                                edgecolor="white", linewidth=0.3)
            if e["lane"] == "compute" and (e["end"] - e["start"]) > span / 80:
                axes[0].text((e["start"] + e["end"]) / 2, i, str(e["micro"]), ha="center", va="center", fontsize=7,
                             color="white")
    for row in simulated.rows():
        device, lane, kind, micro, _, start, end = row
        if device not in ranks or lane == "recv":
            continue
        i = ranks.index(device)
        y0, h = (i - 0.3, 0.6) if lane == "compute" else (i + 0.32, 0.18)
        axes[1].broken_barh([(start, end - start)], (y0, h), facecolors=colours.get(kind, "grey"), edgecolor="white",
                            linewidth=0.3)
        if lane == "compute" and micro >= 0 and (end - start) > span / 80:
            axes[1].text((start + end) / 2, i, str(micro), ha="center", va="center", fontsize=7, color="white")
    for ax, drawn_end, total, name in ((axes[0], measured_end, measured_s, measured_label),
                                       (axes[1], simulated.makespan, predicted_s, f"predicted: {predicted_s * 1e3:.1f} ms")):
        if total > drawn_end:
            ax.axvspan(drawn_end, total, **outside)
        ax.axvline(total, color="black", linewidth=0.8)
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"rank {r}" for r in ranks])
        ax.set_ylim(len(ranks) - 0.4, -0.45)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.2, axis="x")
    axes[1].set_xlabel("seconds since the start of the iteration")
    axes[1].set_xlim(0, span * 1.02)
    fig.suptitle(title, fontsize=10)
    fig.legend(handles=[Patch(color=COLOURS["forward"], label="forward"),
                        Patch(color=COLOURS["backward"], label="backward"),
                        Patch(color=colours["comm"], label="send activation (measured: any wait for a transfer)"),
                        Patch(color=COLOURS["send_backward"], label="send gradient"),
                        Patch(color=colours["allreduce"], label="all-reduce"),
                        Patch(**outside, label="outside the schedule (optimizer, loss, ...)")],
               loc="lower center", ncol=6, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
