"""How a saved-tensor hook changes what torch's split backward (zero-bubble's I and W) keeps alive.

gpt2-tiny cut into two stages, both on one rank (a pipeline group of 1, so no second process is
needed), 8 micro-batches of 8, fp32, no dropout, under torch.distributed.pipelining's
ScheduleInterleaved1F1B (whole backwards) and ScheduleInterleavedZeroBubble (I, then W). Every
tensor autograd saves is followed until autograd lets it go (a weak reference's finalizer), with
two pack hooks:
  identity  the hook returns the tensor itself (what runtime/measure/memory_meter.py did before
            2026-11-26): an op's saved *output* then holds its own grad_fn, a reference cycle inside
            autograd. A whole backward (retain_graph=False) releases the saved tensors and breaks
            it; zero-bubble's input pass runs with retain_graph=True and its weight pass never
            touches the input path, so those cycles keep every micro-batch's input-path tensors
            alive past the step: measured 56.7 MiB at the peak, 52.1 left after the step, against
            10.4 / 3.3 with whole backwards;
  alias     the hook returns a detached alias (what the meter does now): no cycle; both schedules
            peak at 7.43 MiB and leave nothing.
So the "zero-bubble keeps everything" seen on ranks was the meter's own doing; with the alias hook
the ranks measure what the memory model walks (docs/runtime.md). After each action the bytes alive
are recorded; two steps, the second reported.

Writes $PARAPLAN_BENCH_OUT/split_backward_memory.json (default bench-out/). Run:
.venv/bin/python benchmarks/split_backward_memory.py
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining

from paraplan.runtime.rank.data import batch_source
from paraplan.runtime.rank.materialize import StageModule, build_layers, materialize
from paraplan.system.localnet import free_port

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
MICRO_BATCHES = 8
MIB = 2**20


def _measure(schedule_name: str, hook: str) -> dict:
    built, layers, names = build_layers("gpt2-tiny", 0, dropout=False)
    modules = [m for _, _, m in layers]
    materialize(modules, names, 0, torch.device("cpu"), {})
    stages = [pipelining.PipelineStage(StageModule(modules[:3]), 0, 2, torch.device("cpu")),
              pipelining.PipelineStage(StageModule(modules[3:]), 1, 2, torch.device("cpu"))]
    live: dict[int, int] = {}

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if isinstance(base, torch.nn.Parameter):
            return t
        if hook == "alias":  # what autograd holds is the alias: follow it
            alias = t.detach()
            key = id(alias)
            live[key] = t.numel() * t.element_size()
            weakref.finalize(alias, live.pop, key, None)
            return alias
        if id(base) not in live:
            key = id(base)
            live[key] = base.numel() * base.element_size()
            weakref.finalize(base, lambda key=key: live.pop(key, None))
        return t

    trace: list[tuple[int, str, int, float]] = []
    for stage in stages:
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            run = getattr(stage, name)

            def recorded(*args, run=run, name=name, stage=stage, **kwargs):
                out = run(*args, **kwargs)
                trace.append((stage.stage_index, name.removesuffix("_one_chunk"), int(args[0]),
                              sum(live.values()) / MIB))
                return out

            setattr(stage, name, recorded)
    schedule = getattr(pipelining, schedule_name)(stages, MICRO_BATCHES, scale_grads=False,
                                                  loss_fn=lambda out, target: built.loss(out, target) / MICRO_BATCHES)
    inputs, targets = batch_source(built, 8 * MICRO_BATCHES, 0, None, None)(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for _ in range(2):
            trace.clear()
            schedule.step(inputs, target=targets, losses=[], return_outputs=False)
    return {"schedule": schedule_name, "hook": hook, "peak_alive_mib": max(t[3] for t in trace),
            "alive_after_step_mib": sum(live.values()) / MIB,
            "trace": [{"stage": s, "action": a, "micro": m, "alive_mib": round(b, 3)} for s, a, m, b in trace]}


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        results = [_measure(name, hook) for hook in ("identity", "alias")
                   for name in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble")]
    finally:
        dist.destroy_process_group()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "split_backward_memory.json").write_text(json.dumps(
        {"model": "gpt2-tiny", "stages": 2, "micro_batches": MICRO_BATCHES, "micro_batch_size": 8,
         "torch": torch.__version__, "results": results}, indent=1))
    for r in results:
        print(f"{r['schedule']}, {r['hook']} hook: peak {r['peak_alive_mib']:.2f} MiB alive, {r['alive_after_step_mib']:.2f} MiB "
              "left after the step")


if __name__ == "__main__":
    main()
