"""Did the comparison's speed-ups cost plan quality? (issue 51, Done when: "on the requests of
results/bound_gap.json, today's winning plans (saved from the commit before) re-simulated under the
same cost model are no faster than the new winners").

For bound_gap.py's seven LLM requests (Llama-2-like on DGX A100 presets, bf16, the comparison's 60 s
limit), the comparison (planners/auto.py) runs once with the code of `--before` (default b36e111~1,
the commit before issue 51's first search speed-up; checked out in a temporary git worktree) and
once with this checkout's; each winner's plan is saved. The old winners are then re-simulated under
this checkout's cost model and compared with this checkout's winners: a ratio below 1 would be a
better plan the faster search no longer finds.

Writes $PARAPLAN_BENCH_OUT/bound_gap_before_after.json (default bench-out/). About 20 minutes here
(two comparisons of up to a minute for each of 7 requests). Run:
.venv/bin/python benchmarks/bound_gap_before_after.py [--before REV]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
# run in the code under test (its own benchmarks/bound_gap.py and paraplan): each LLM request's winner
DRIVER = """
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import bound_gap as bg
from paraplan.planners.auto import compare
from paraplan.plans.plan_file import plan_to_dict
from paraplan.workload import workload
out = {}
for name, model, cluster, batch, seq in bg.REQUESTS:
    if not name.startswith("llama"):
        continue
    load = os.getloadavg()[0]
    w = workload(model, cluster, batch=batch, seq_len=seq, operators="optional")
    r = compare(w.request, time_limit_s=60)
    best = r.row(r.best)
    out[name] = {"planner": r.best, "shape": best.shape, "iteration_s": best.iteration_s,
                 "plan": plan_to_dict(best.plan), "load": round(load, 2)}
json.dump(out, open(os.environ["PARAPLAN_WINNERS_OUT"], "w"))
"""


def winners(source: Path, path: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONPATH": str(source / "src"),
           "PARAPLAN_WINNERS_OUT": str(path)}
    subprocess.run([sys.executable, "-c", DRIVER], cwd=source, env=env, check=True)
    return json.loads(path.read_text())


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--before", default="b36e111~1", help="the commit whose winners are re-simulated")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bound_gap as bg

    from paraplan.plans.plan_file import plan_from_dict
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    with tempfile.TemporaryDirectory(prefix="paraplan-before-") as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree), args.before], cwd=ROOT, check=True)
        try:
            old = winners(worktree, Path(tmp) / "old.json")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
        new = winners(ROOT, Path(tmp) / "new.json")
    rows = []
    for name, model, cluster, batch, seq in bg.REQUESTS:
        if name not in old:
            continue
        w = workload(model, cluster, batch=batch, seq_len=seq)
        again = simulate_plan(plan_from_dict(old[name]["plan"], f"{args.before}: {name}"), w.request.costs).prediction
        rows.append({"request": name, "old_winner": old[name]["planner"], "old_shape": old[name]["shape"],
                     "old_resimulated_s": again.iteration_s, "old_fits": again.feasible,
                     "new_winner": new[name]["planner"], "new_shape": new[name]["shape"], "new_s": new[name]["iteration_s"],
                     "old_over_new": again.iteration_s / new[name]["iteration_s"],
                     "load_old": old[name]["load"], "load_new": new[name]["load"]})
        print(f"{name}: {args.before}'s {old[name]['planner']} re-simulated {again.iteration_s:.4g} s "
              f"(fits: {again.feasible}); now {new[name]['planner']} {new[name]['iteration_s']:.4g} s: "
              f"x{rows[-1]['old_over_new']:.3f}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bound_gap_before_after.json").write_text(json.dumps(
        {"before": args.before, "requests": rows,
         "no_old_winner_faster": all(r["old_over_new"] >= 1 - 1e-9 or not r["old_fits"] for r in rows)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
