"""Memory against the literature: costs/transformer_memory.py beside the figures the papers print.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"): their §4
closed forms (Table 2) applied to two Table 3 configurations, per GPU on the first pipeline stage,
embeddings excluded as in the paper:
  22B   h 6144, a 64, 48 layers, TP 8, PP 1, micro-batch 4, seq 2048;
  175B  h 12288, a 96, 96 layers, TP 8, PP 8 interleaved x3, micro-batch 1, seq 2048;
activations with tensor parallelism only and with sequence parallelism + selective recomputation,
and the 22B's model states at 18 bytes per parameter (Megatron's fp32 gradients) and 16 (ZeRO's).
ZeRO (Rajbhandari et al. 2020) Fig. 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam, decimal GB.

The paper figures are typed in from the papers (the same as tests/unit/test_literature_memory.py,
which asserts them within 3%); ours are the tensor-by-tensor inventory. Writes
$PARAPLAN_BENCH_OUT/literature_memory.{json,png} (default bench-out/); `make results` writes them
into results/. Run: .venv/bin/python benchmarks/literature_memory.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from paraplan.costs.transformer_memory import (
    TransformerShape,
    interleaved_factor,
    layer_activation_bytes,
    state_bytes_per_param,
)

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
GIB = 2**30
SEQ = 2048
CONFIGS = {"22B": dict(hidden=6144, heads=64, layers=48, tp=8, pp=1, virtual=1, micro=4),
           "175B": dict(hidden=12288, heads=96, layers=96, tp=8, pp=8, virtual=3, micro=1)}


def _activations(cfg: dict, sequence_parallel: bool, recompute: str) -> float:
    shape = TransformerShape(hidden=cfg["hidden"], heads=cfg["heads"], seq_len=SEQ)
    per_layer = layer_activation_bytes(shape, cfg["micro"], 2, cfg["tp"], sequence_parallel, recompute,
                                       include_statistics=False)
    return per_layer * cfg["layers"] * interleaved_factor(cfg["pp"], cfg["virtual"])


def rows() -> list[dict]:
    out = []
    for name, cfg, form, sp, recompute, paper in (
            ("22B", CONFIGS["22B"], "TP only", False, "none", 59.25),
            ("22B", CONFIGS["22B"], "SP + selective", True, "selective", 9.56),
            ("175B", CONFIGS["175B"], "TP only", False, "none", 66.84),
            ("175B", CONFIGS["175B"], "SP + selective", True, "selective", 12.35)):
        out.append({"source": "Korthikanti et al. 2022, Table 2 forms on Table 3", "case": f"{name} activations, {form}",
                    "unit": "GiB", "paper": paper, "ours": _activations(cfg, sp, recompute) / GIB})
    h, layers = CONFIGS["22B"]["hidden"], CONFIGS["22B"]["layers"]
    per_gpu = (12 * h * h + 13 * h) * layers / CONFIGS["22B"]["tp"]
    for per_param, paper in ((18, 45.56), (16, 40.50)):
        states = state_bytes_per_param(mixed=True, fp32_gradients=per_param == 18).total
        out.append({"source": "Korthikanti et al. 2022, Table 3", "case": f"22B states, {per_param} B/param",
                    "unit": "GiB", "paper": paper, "ours": per_gpu * states / GIB})
    for stage, label, paper in ((0, "DP", 120), (1, "ZeRO-1", 31.4), (2, "ZeRO-2", 16.6), (3, "ZeRO-3", 1.9)):
        states = state_bytes_per_param(mixed=True, zero_stage=stage, data_parallel=64).total
        out.append({"source": "ZeRO, Fig. 1", "case": f"7.5B on 64, {label}", "unit": "GB", "paper": paper,
                    "ours": 7.5e9 * states / 1e9})
    for r in out:
        r["error"] = r["ours"] / r["paper"] - 1
    return out


def figure(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    y = range(len(table))
    ax.barh([i + 0.2 for i in y], [r["paper"] for r in table], 0.4, color="#9aa5b1", label="paper")
    ax.barh([i - 0.2 for i in y], [r["ours"] for r in table], 0.4, color="#3b6fb6", label="paraplan")
    for i, r in enumerate(table):
        ax.text(max(r["ours"], r["paper"]) * 1.05, i, f"{r['error']:+.1%}", va="center", fontsize=8)
    ax.set_yticks(list(y), [f"{r['case']} ({r['unit']})" for r in table], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("bytes per GPU (log scale; GiB or GB as the paper gives them)")
    ax.set_title("Activation and state memory: the papers' figures and paraplan's", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    table = rows()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "literature_memory.json").write_text(json.dumps({"rows": table}, indent=1))
    figure(table, OUT / "literature_memory.png")
    print("| source | case | paper | paraplan | error |\n|---|---|---|---|---|")
    for r in table:
        print(f"| {r['source']} | {r['case']} | {r['paper']:g} {r['unit']} | {r['ours']:.2f} {r['unit']} | "
              f"{r['error']:+.1%} |")


if __name__ == "__main__":
    main()
