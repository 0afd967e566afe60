"""The runtime's overhead: `paraplan train` against a bare script of torch.distributed.pipelining +
FSDP2 with the same stages, strategies, schedule, data and seed, interleaved in one run
(ours, bare, ours, bare, ...). Two plans of tiny Llama on 2 gloo ranks: a pipeline (2 stages,
1F1B, 4 micro-batches) and a hybrid one (one stage, SDP2 on every layer: FSDP2).

The bare script is what a user would write by hand: each rank builds its layers the same way,
FSDP2 `fully_shard` per layer and on the stage (hybrid), `PipelineStage` + the schedule, the data
split by rank, SGD, and times the same span as `paraplan train` (zero_grad .. optimizer step). It
has none of ours: no timeline recorder, no Slice-Gather wrappers, no loss all-reduce for the report.

Writes bench-out/runtime_overhead/{runs.json, summary.md} (`make results`: results/runtime_overhead/).
Run: .venv/bin/python benchmarks/runtime_overhead.py [--rounds 4] [--steps 12]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "runtime_overhead"
MODEL = "llama-tiny"
BATCH = 16
WARMUP_STEPS = 2
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _plans():
    from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage

    pipeline = Plan(model=MODEL, cluster="local", n_layers=6, global_batch=BATCH, n_micro=4, schedule="1f1b",
                    grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
    hybrid = Plan(model=MODEL, cluster="local", n_layers=6, global_batch=BATCH, n_micro=2, schedule="1f1b",
                  grad_sync="none", stages=(Stage(LayerRange(0, 6), (0, 1),
                                                  strategies=(LayerStrategy(sdp=2),) * 6),))
    return {"pipeline 3+3, 1F1B, m=4": pipeline, "hybrid SDP2, m=2": hybrid}


def bare_rank(rank: int, world: int, port: int, plan_path: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from paraplan.plans.kinds import PlanKind
    from paraplan.plans.plan_file import read_plan
    from paraplan.runtime.rank.materialize import StageModule, build_layers, materialize

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    plan = read_plan(plan_path)
    built, layers, names = build_layers(plan.model, 0)
    hybrid = plan.kind is PlanKind.LAYERS
    stage_index = 0 if hybrid else rank
    stage = plan.stages[stage_index]
    own = [m for _, _, m in layers[stage.layers.start:stage.layers.stop]]
    materialize(own, names, 0, torch.device("cpu"))
    module = StageModule(own)
    if hybrid:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("sdp",))
        for layer in own:
            fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
        pp_group, n_stages = dist.new_group([rank]), 1
    else:
        pp_group, n_stages = dist.group.WORLD, plan.n_stages
    module.train()
    pipe = PipelineStage(module, 0 if hybrid else stage_index, n_stages, torch.device("cpu"), group=pp_group)
    schedule = Schedule1F1B(pipe, plan.n_micro, loss_fn=lambda out, y: built.loss(out, y) / plan.n_micro,
                            scale_grads=False)
    optim = torch.optim.SGD(module.parameters(), lr=1e-3)
    times = []
    for step in range(steps):
        inputs, targets = built.batch(plan.global_batch, seed=step)
        if hybrid:  # data parallel the usual way: each rank its half of the batch
            half = plan.global_batch // world
            inputs, targets = inputs[rank * half:(rank + 1) * half], targets[rank * half:(rank + 1) * half]
        optim.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if hybrid:
            schedule.step(inputs, target=targets)
        elif stage_index == 0:
            schedule.step(inputs)
        else:
            schedule.step(target=targets)
        optim.step()
        times.append(time.perf_counter() - t0)
    Path(out, f"steps_rank{rank}.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def _bare(plan_path: Path, steps: int, out: Path) -> None:
    import torch.multiprocessing as mp

    from paraplan.system.localnet import free_port

    mp.start_processes(bare_rank, args=(2, free_port(), str(plan_path), steps, str(out)), nprocs=2,
                       start_method="spawn")


def _ours(plan_path: Path, steps: int, out: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "paraplan", "train", "--plan", str(plan_path), "--steps", str(steps),
                          "--out-dir", str(out), "--optimizer", "sgd"], capture_output=True, text=True, env=ENV,
                         timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stderr)


def _median_step(out: Path, steps: int) -> float:
    ranks = [json.loads(f.read_text()) for f in sorted(out.glob("steps_rank*.json"))]
    return statistics.median([max(r[i] for r in ranks) for i in range(steps)][WARMUP_STEPS:])


def main() -> None:
    from _paraplan_cli import bench_parser

    from paraplan.plans.plan_file import write_plan

    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, plan in _plans().items():
        path = OUT / f"{name.split()[0]}.json"
        write_plan(plan, path)
        ours, bare = [], []
        for r in range(args.rounds):  # interleaved: ours, bare, ours, bare ...
            for label, run, into in (("paraplan", _ours, ours), ("bare", _bare, bare)):
                out = OUT / "run"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                run(path, args.steps, out)
                into.append(_median_step(out, args.steps))
                print(f"{name}: round {r + 1} {label:8s} {into[-1] * 1e3:7.2f} ms", flush=True)
        ratios = [a / b for a, b in zip(ours, bare, strict=True)]
        results[name] = {"paraplan_s": ours, "bare_s": bare, "ratio_per_round": ratios,
                         "overhead": statistics.median(ours) / statistics.median(bare) - 1}
    (OUT / "runs.json").write_text(json.dumps({"model": MODEL, "batch": BATCH, "steps": args.steps,
                                               "rounds": args.rounds, "plans": results}, indent=1))
    lines = ["# Runtime overhead: paraplan train against a bare pipelining + FSDP2 script", "",
             f"{MODEL}, global batch {BATCH}, 2 gloo ranks, {args.steps} steps per run (first {WARMUP_STEPS} "
             f"dropped), {args.rounds} interleaved rounds (ours, bare, ours, bare, ...).", "",
             "| plan | paraplan median step (per round) | bare (per round) | overhead of medians | per-round ratio "
             "(min..max) |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {statistics.median(r['paraplan_s']) * 1e3:.2f} ms "
                     f"({', '.join(f'{x * 1e3:.1f}' for x in r['paraplan_s'])}) | "
                     f"{statistics.median(r['bare_s']) * 1e3:.2f} ms ({', '.join(f'{x * 1e3:.1f}' for x in r['bare_s'])})"
                     f" | {r['overhead']:+.1%} | {min(r['ratio_per_round']):.3f}..{max(r['ratio_per_round']):.3f} |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
