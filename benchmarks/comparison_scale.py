"""`paraplan plan` (every method, bf16) at 64, 1,024 and 16,384 H100s (issue 51 item 2): how long the
comparison takes, which planners finished, were skipped (with their reasons) or ran out of time, and
the CPU seconds spent, with the machine's load beside each.

The requests are the issue's: Llama 3 70B (80 layers, h 8192, FFN 28672, 64 / 8 heads, vocabulary
128,256, sequence 8192) at global batch 512 on 64 H100 and at 4,096 on 1,024 H100, and Llama 3 405B at
16M tokens a batch (2,048 sequences of 8192) on 16,384 H100. Each runs as a user runs it, `paraplan plan
--json` in a process of its own with the comparison's default time limit (60 s), one after another.

Writes $PARAPLAN_BENCH_OUT/comparison_scale.json and comparison_scale.png (per request: the planners'
statuses and the wall and CPU seconds). Run: .venv/bin/python benchmarks/comparison_scale.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
LLAMA3_70B = ("hf:llama?hidden_size=8192&intermediate_size=28672&num_hidden_layers=80&num_attention_heads=64"
              "&num_key_value_heads=8&vocab_size=128256&max_position_embeddings=8192&seq_len=8192")
LLAMA3_405B = ("hf:llama?hidden_size=16384&intermediate_size=53248&num_hidden_layers=126&num_attention_heads=128"
               "&num_key_value_heads=8&vocab_size=128256&max_position_embeddings=8192&seq_len=8192")
REQUESTS = (("Llama 3 70B, 64 H100, batch 512", LLAMA3_70B, 8, 512),
            ("Llama 3 70B, 1,024 H100, batch 4,096", LLAMA3_70B, 128, 4096),
            ("Llama 3 405B, 16,384 H100, batch 2,048 (16M tokens)", LLAMA3_405B, 2048, 2048))
# the targets (issue 51, Done when): every planner finished or skipped, none timed out; and
TARGET_S = {1024: 20.0, 16384: 60.0}


def run(label: str, model: str, nodes: int, batch: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # the plan file it writes is not kept
        res = subprocess.run([sys.executable, "-m", "paraplan", "plan", "--model", model, "--cluster",
                              f"dgx-h100-80gb?nodes={nodes}", "--batch", str(batch), "--precision", "bf16", "--json",
                              "--quiet", "--out", str(Path(tmp) / "plan.json")], capture_output=True, text=True,
                             env=env, timeout=900)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        raise RuntimeError(f"{label}: {res.stderr[-2000:]}")
    out = json.loads(res.stdout)
    rows = [{"planner": r["planner"], "status": r["status"], "iteration_s": r.get("iteration_s"),
             "search_s": r.get("search_s"), "reason": r.get("reason", "")} for r in out["rows"]]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    gpus = nodes * 8
    row = {"request": label, "gpus": gpus, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
           "load_before": round(load, 2), "statuses": counts, "best": out.get("best"),
           "target_s": TARGET_S.get(gpus), "timed_out": [r["planner"] for r in rows if r["status"] == "timeout"],
           "stopped_at_limit": [r["planner"] for r in rows if "stopped at the time limit" in (r["reason"] or "")],
           "rows": rows}
    print(f"{label}: {row['wall_s']} s wall, {row['cpu_s']} CPU s at load {row['load_before']}; {counts}; "
          f"timed out {row['timed_out']}, stopped {row['stopped_at_limit']}", flush=True)
    return row


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    statuses = ("ok", "infeasible", "skipped", "timeout", "failed")
    colors = {"ok": "tab:green", "infeasible": "tab:orange", "skipped": "tab:gray", "timeout": "tab:red",
              "failed": "black"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r['gpus']:,} GPUs" for r in rows]
    bottom = [0] * len(rows)
    for s in statuses:
        values = [r["statuses"].get(s, 0) for r in rows]
        left.bar(labels, values, bottom=bottom, color=colors[s], label=s)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set_ylabel("planners")
    left.set_title("How each planner ended")
    left.legend(fontsize=8)
    right.bar(labels, [r["wall_s"] for r in rows], color="tab:blue", label="wall")
    right.plot(labels, [r["target_s"] or float("nan") for r in rows], "r_", ms=30, mew=2, label="issue 51's target")
    right.set_ylabel("seconds")
    right.set_title("The comparison's wall time (limit 60 s)")
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    rows = [run(*request) for request in REQUESTS]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "comparison_scale.json").write_text(json.dumps({"requests": rows}, indent=1))
    figure(rows, OUT / "comparison_scale.png")
    print(f"wrote {OUT / 'comparison_scale.json'} and comparison_scale.png")


if __name__ == "__main__":
    main()
