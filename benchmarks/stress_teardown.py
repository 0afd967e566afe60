"""Stress the way ranks end: many fresh launches of two real rank processes, counting the launches
that fail (a rank that aborts at exit shows as "rank R exited with code -6"), with each failure's
message. Not part of `make results`: the lead runs it by hand before a release.

Kinds of run (gpt2-tiny, batch 8, a few steps each, round-robin so that the machine's drift hits
all alike):
  tp     TP2 on every layer (DTensor), one stage on 2 ranks;
  sdp    SDP2 on every layer (FSDP2), one stage on 2 ranks;
  mixed  alternately a 2-stage 1F1B pipeline (no DTensor) and one stage whose layers mix TP, SDP
         (with checkpointing) and DP, as Galvatron-BMW's plans do.
Each run is `paraplan.runtime.launcher.launch.spawn` (the path `paraplan train` takes): two new rank
processes (forked from this process's forkserver, as `paraplan train`'s are; PARAPLAN_START_METHOD=spawn
for fresh interpreters) that train, tear down and exit; with --cli each run is a whole `paraplan train` process.
Optionally L `paraplan calibrate --quick --devices 2` in a row (--calibrates): their exit status and
any "died at exit ... retrying once" line they printed.

Writes $PARAPLAN_BENCH_OUT/stress_teardown/stress.json (default bench-out/), or --out FILE.
Run: .venv/bin/python benchmarks/stress_teardown.py --tp 100 --sdp 50 --mixed 50 --calibrates 10
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "stress_teardown" / "stress.json"
MODEL = "gpt2-tiny"
BATCH = 8
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _plans() -> dict[str, list]:
    from paraplan.plans.plan import LayerRange, Plan, Stage
    from paraplan.plans.plan import LayerStrategy as S

    def one_stage(strategies, n_micro=1):
        return Plan(model=MODEL, cluster="local", n_layers=6, global_batch=BATCH, n_micro=n_micro, schedule="gpipe",
                    grad_sync="none", stages=(Stage(LayerRange(0, 6), (0, 1), strategies=tuple(strategies)),))

    pipeline = Plan(model=MODEL, cluster="local", n_layers=6, global_batch=BATCH, n_micro=2, schedule="1f1b",
                    grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
    # GPT-2's embedding (layer 0) and head (layer 5) share a weight: the same strategy
    mixed = one_stage([S(tp=2), S(sdp=2), S(sdp=2, recompute="full"), S(dp=2), S(tp=2, recompute="full"), S(tp=2)],
                      n_micro=2)
    return {"tp": [one_stage([S(tp=2)] * 6)], "sdp": [one_stage([S(sdp=2)] * 6)], "mixed": [pipeline, mixed]}


def _order(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Round-robin over the kinds: (kind, index within the kind)."""
    order, done = [], dict.fromkeys(counts, 0)
    while any(done[k] < counts[k] for k in counts):
        for kind in counts:
            if done[kind] < counts[kind]:
                order.append((kind, done[kind]))
                done[kind] += 1
    return order


def _run_spawn(plan, steps: int, timeout_s: float, out_dir: Path) -> str | None:
    """None when the launch ended cleanly, else its one-line failure."""
    from paraplan.errors import ParaplanError
    from paraplan.runtime.config import TrainConfig
    from paraplan.runtime.launcher.launch import spawn

    config = TrainConfig(plan=plan, model=plan.model, steps=steps, timeout_s=timeout_s, out_dir=str(out_dir))
    try:
        spawn(config, len(plan.devices))
    except ParaplanError as exc:
        return str(exc)
    except Exception as exc:  # a bug rather than a rank's failure: still one line, still counted
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _run_cli(plan, steps: int, timeout_s: float, out_dir: Path) -> str | None:
    from paraplan.plans.plan_file import write_plan

    plan_path = out_dir.parent / f"{out_dir.name}.json"
    write_plan(plan, plan_path)
    res = subprocess.run([sys.executable, "-m", "paraplan", "train", "--plan", str(plan_path), "--steps", str(steps),
                          "--out-dir", str(out_dir), "--timeout", str(timeout_s)], capture_output=True, text=True,
                         env=ENV, timeout=600)
    if res.returncode == 0:
        return None
    return f"exit status {res.returncode}: " + (res.stderr.strip().splitlines() or ["(no output)"])[-1]


def _calibrate(index: int, tmp: Path) -> dict:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "paraplan", "calibrate", "--quick", "--devices", "2", "--out",
                          str(tmp / f"calibrated{index}.toml")], capture_output=True, text=True, env=ENV,
                         timeout=3600)
    retries = [line.strip() for line in res.stderr.splitlines() if "died at exit" in line]
    last = (res.stderr.strip().splitlines() or [""])[-1]
    return {"index": index, "ok": res.returncode == 0, "exit_status": res.returncode, "retries": retries,
            "seconds": time.perf_counter() - t0, "error": None if res.returncode == 0 else last}


def main() -> int:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--tp", type=int, default=3, help="TP2 launches")
    parser.add_argument("--sdp", type=int, default=3, help="SDP2 (FSDP2) launches")
    parser.add_argument("--mixed", type=int, default=3, help="mixed launches (pipeline / per-layer mix)")
    parser.add_argument("--calibrates", type=int, default=0, help="`paraplan calibrate --quick --devices 2` runs")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a collective's timeout in each run")
    parser.add_argument("--cli", action="store_true", help="each run a whole `paraplan train` process")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME="lo")
    plans = _plans()
    run = _run_cli if args.cli else _run_spawn
    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="paraplan-stress-") as tmp:
        for n, (kind, i) in enumerate(_order({"tp": args.tp, "sdp": args.sdp, "mixed": args.mixed})):
            plan = plans[kind][i % len(plans[kind])]
            out_dir = Path(tmp) / f"{kind}{i}"
            out_dir.mkdir()
            t0 = time.perf_counter()
            error = run(plan, args.steps, args.timeout_s, out_dir)
            seconds = time.perf_counter() - t0
            runs.append({"kind": kind, "index": i, "plan": "pipeline" if plan.n_stages > 1 else kind,
                         "ok": error is None, "seconds": seconds, "error": error})
            print(f"[{n + 1}] {kind} {i}: {'ok' if error is None else 'FAILED: ' + error} ({seconds:.1f} s)",
                  flush=True)
        calibrates = []
        for i in range(args.calibrates):
            calibrates.append(_calibrate(i, Path(tmp)))
            c = calibrates[-1]
            print(f"calibrate {i}: {'ok' if c['ok'] else 'FAILED: ' + str(c['error'])}, {len(c['retries'])} "
                  f"retried run(s) ({c['seconds']:.0f} s)", flush=True)
    per_kind = {}
    for kind in ("tp", "sdp", "mixed"):
        mine = [r for r in runs if r["kind"] == kind]
        if mine:
            per_kind[kind] = {"runs": len(mine), "failures": sum(not r["ok"] for r in mine),
                              "median_s": statistics.median(r["seconds"] for r in mine),
                              "max_s": max(r["seconds"] for r in mine)}
    failures = [r for r in runs if not r["ok"]]
    result = {"schema": "paraplan.bench.stress_teardown/1", "model": MODEL, "batch": BATCH, "steps": args.steps,
              "via": "paraplan train" if args.cli else "runtime.launch.spawn",
              "rank_start_method": os.environ.get("PARAPLAN_START_METHOD", "forkserver"), "runs": runs,
              "per_kind": per_kind, "failures": len(failures), "calibrate": calibrates,
              "calibrate_failures": sum(not c["ok"] for c in calibrates),
              "calibrate_retries": sum(len(c["retries"]) for c in calibrates),
              "seconds": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for kind, k in per_kind.items():
        print(f"{kind}: {k['failures']} of {k['runs']} failed; median {k['median_s']:.1f} s per run")
    for r in failures:
        print(f"  {r['kind']} {r['index']}: {r['error']}")
    if calibrates:
        print(f"calibrate: {result['calibrate_failures']} of {len(calibrates)} failed, "
              f"{result['calibrate_retries']} run(s) retried after dying at exit")
    print(f"written to {args.out}")
    return 1 if failures or result["calibrate_failures"] else 0


if __name__ == "__main__":  # spawned ranks import this file again: nothing may run on import
    sys.exit(main())
