"""The HTML report's figures, embedded as base64 PNG data URLs: the simulator's own Gantt drawing of a
plan (simulator/export.py), memory per device, the per-layer strategies (Galvatron family), the
forward / backward ranges (Bi-Partition) and every feasible plan against the lower bound. Drawn on
matplotlib's Figure without pyplot: no global backend switch, nothing left open.
"""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path

from paraplan.plans.kinds import PlanKind
from paraplan.plans.worker_roles import worker_roles
from paraplan.report.html.text import escape as _e
from paraplan.report.html.text import fmt_time
from paraplan.simulator.export import gantt

BLUE, GREEN, GREY, RED, ORANGE = "#4C72B0", "#55A868", "#9aa4b1", "#C44E52", "#DD8452"
DPI = 100


def _figure(width: float, height: float):
    # Figure without pyplot: no global backend switch, nothing left open (Agg renders savefig)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    return fig, fig.add_subplot()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def img(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{_e(alt)}">'


def gantt_html(row, sims) -> str:
    """The project's own Gantt (what `paraplan simulate --gantt` draws), of the plan simulated again:
    one row per device role (simulator/export.py: gantt_rows), the whole iteration, and under it
    what the chart left out."""
    sim = sims(row)
    if isinstance(sim, str):
        return f'<p class="note">No timeline: {_e(sim)}</p>'
    # gantt() writes a file by name (atomically, beside it): a private temporary directory, read back
    with tempfile.TemporaryDirectory(prefix="paraplan-report-") as tmp:
        path = Path(tmp) / "gantt.png"
        caption = gantt(sim.timeline, path, title=f"{row.planner}: {row.shape}, iteration "
                        f"{fmt_time(sim.prediction.iteration_s)}", plan=row.plan, iteration_s=sim.prediction.iteration_s)
        figure = img(path.read_bytes(), f"timeline of {row.planner}")
    return figure + (f'<p class="note">{_e(caption[0].upper() + caption[1:])}.</p>' if caption else "")


def memory_figure(row, sims) -> bytes:
    """Peak per device, split into model states / activations / the rest where the simulator's
    breakdown covers every device (layer plans), with each device's capacity as a tick."""
    memory = row.plan.prediction.memory if row.plan is not None and row.plan.prediction else ()
    devices = [m.device for m in memory] if len(memory) == len(row.peak_bytes) else list(range(len(row.peak_bytes)))
    unit, size = ("GiB", 2**30) if max(row.peak_bytes + row.capacity_bytes) >= 2**30 else ("MiB", 2**20)
    peaks = [b / size for b in row.peak_bytes]
    caps = [b / size for b in row.capacity_bytes]
    parts = _breakdown(row, sims, devices, size)
    fig, ax = _figure(6.2, 3.4)
    x = range(len(devices))
    if parts is not None and all(p <= c for p, c in zip(peaks, caps, strict=True)):
        bottom = [0.0] * len(devices)
        for (label, values), colour in zip(parts.items(), (BLUE, GREEN, GREY), strict=True):
            ax.bar(x, values, 0.7, bottom=bottom, color=colour, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    else:
        ax.bar(x, peaks, 0.7, color=[RED if p > c else BLUE for p, c in zip(peaks, caps, strict=True)],
               label="peak")
    ax.hlines(caps, [i - 0.45 for i in x], [i + 0.45 for i in x], colors="black", linewidth=2, label="capacity")
    step = max(1, -(-len(devices) // 16))  # at most 16 labels: 64 overlapping numbers read as none
    ax.set_xticks(list(x)[::step], [str(d) for d in devices][::step], fontsize=8)
    ax.set_xlabel("device")
    ax.set_ylabel(unit)
    ax.set_ylim(0, max(peaks + caps) * 1.12)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def _breakdown(row, sims, devices, size: int) -> dict[str, list[float]] | None:
    """States / activations / other (buffers, reserve, allocator) per device in `size` units at the
    instant of its peak (they sum to it), or None where the
    simulator gives no per-device breakdown (operator placements) or it does not match the peaks."""
    if row.plan is None or row.plan.kind is PlanKind.OPERATORS:
        return None
    sim = sims(row)
    if isinstance(sim, str):
        return None
    # a stage whose devices compute together (per-layer strategies) has one breakdown, on its
    # first device, for all of them
    by_device = {d: m for m in sim.memory for d in row.plan.stages[m.stage].devices}
    if set(by_device) != set(devices) or len(devices) != len(row.peak_bytes) or any(
            abs(by_device[d].peak_bytes - p) > 0.01 * p for d, p in zip(devices, row.peak_bytes, strict=True)):
        return None
    # what each device holds at the instant of its peak (MemoryBreakdown.at_peak), in three bars
    groups = {"parameters": "model states", "16-bit weight copies": "model states", "gradients": "model states",
              "optimizer states": "model states", "activations": "activations"}
    out: dict[str, list[float]] = {"model states": [], "activations": [], "other": []}
    for d in devices:
        totals = dict.fromkeys(out, 0.0)
        for name, nbytes in by_device[d].at_peak()[1]:
            totals[groups.get(name, "other")] += nbytes / size
        for key in out:
            out[key].append(totals[key])
    return out


def strategy_figure(rows: list) -> bytes:
    from matplotlib.patches import Patch

    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
               "#CCB974", "#64B5CD"]
    colours: dict[str, str] = {}  # the layout without CKPT: the same layout, the same colour, in every row
    fig, ax = _figure(11, 0.75 * len(rows) + 1.7)
    n_layers = max(r.plan.n_layers for r in rows)
    for y, r in enumerate(rows):
        for stage in r.plan.stages:
            for layer in stage.layers:
                s = stage.strategy(layer)
                key = str(s).removesuffix(" + CKPT")
                colour = colours.setdefault(key, palette[len(colours) % len(palette)])
                ax.barh(y, 1, left=layer, height=0.6, color=colour, edgecolor="white", linewidth=0.3,
                        hatch="///" if s.checkpoint else None)
            if stage.layers.start > 0:
                ax.vlines(stage.layers.start, y - 0.4, y + 0.4, colors="black", linewidth=2)
    ax.set_yticks(range(len(rows)), [r.planner for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, n_layers)
    ax.set_xlabel("layer")
    handles = [Patch(facecolor=c, label=k) for k, c in colours.items()]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="+ CKPT"))
    # legends above the axes: below, their distance would depend on the figure's height
    ax.legend(handles=handles, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=min(len(handles), 6), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def bipartition_figure(row) -> bytes:
    from matplotlib.patches import Patch

    roles = worker_roles(row.plan)
    fig, ax = _figure(11, 0.42 * len(roles) + 1.6)
    for w, role in enumerate(roles):
        for (start, stop), colour, dy in ((role.forward, BLUE, -0.2), (role.backward, GREEN, 0.2)):
            if stop > start:
                ax.barh(w + dy, stop - start, left=start, height=0.36, color=colour)
        for layer in role.recomputed:
            ax.barh(w + 0.2, 1, left=layer, height=0.36, color=GREEN, hatch="///", edgecolor="white", linewidth=0)
    ax.set_yticks(range(len(roles)), [f"worker {w}" for w in range(len(roles))])
    ax.invert_yaxis()
    ax.set_xlim(0, row.plan.n_layers)
    ax.set_xlabel("layer")
    ax.legend(handles=[Patch(color=BLUE, label="forward"), Patch(color=GREEN, label="backward"),
                       Patch(facecolor=GREEN, hatch="///", edgecolor="white", label="backward, recomputed")],
              fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def bound_figure(ranked: list, bound: float, best) -> bytes:
    fig, ax = _figure(9, 0.26 * len(ranked) + 1.3)
    times = [r.iteration_s for r in ranked]
    unit, scale = ("s", 1.0) if max(times + [bound]) >= 1 else ("ms", 1e3)
    ax.barh(range(len(ranked)), [t * scale for t in times], 0.7,
            color=[ORANGE if r is best else BLUE for r in ranked])
    for i, t in enumerate(times):
        ax.text(t * scale, i, f"  {fmt_time(t)}  (+{t / bound - 1:.0%})" if bound > 0 else f"  {fmt_time(t)}",
                va="center", fontsize=9)
    ax.axvline(bound * scale, color="black", linestyle="--", linewidth=1.2)
    ax.text(bound * scale, -0.9, f" lower bound {fmt_time(bound)}", fontsize=9, va="bottom")
    ax.set_yticks(range(len(ranked)), [r.planner for r in ranked], fontsize=9)
    ax.set_ylim(len(ranked) - 0.5, -1.2)
    ax.set_xlim(0, max(times) * scale * 1.25)
    ax.set_xlabel(f"predicted iteration time ({unit})")
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)
