"""`paraplan plan --planner auto --report DIR`: the comparison of every planner as one HTML page,
DIR/index.html, that opens anywhere and can be mailed on its own: figures are PNGs embedded as
base64 data URLs, the stylesheet is inline, nothing is fetched and no script runs.

What it shows: the verdict (the chosen plan, its gap to the lower bound, the runner-up), every
planner's row, the winner's and runner-up's timelines (the simulator's own Gantt drawing,
simulator/export.py), their memory per device, the per-layer strategies (Galvatron family) or
forward/backward ranges (Bi-Partition) where a plan has them, and every feasible plan against the
lower bound. Numbers come from the Comparison's rows (judged with the request's cost model,
memory budget included); plans are simulated again here only for their timelines.
"""

from __future__ import annotations

import base64
import html
import io
import tempfile
from pathlib import Path

from paraplan.errors import ParaplanError
from paraplan.plans.worker_roles import worker_roles
from paraplan.report.tables import compared_text, in_unit, memory_text, percent, seconds_unit, tightest_memory
from paraplan.simulator.export import gantt
from paraplan.simulator.predict import simulate_plan
from paraplan.simulator.time_split import against_bound
from paraplan.system.fileio import atomic_write_text, make_dirs

STATUS_ORDER = {"ok": 0, "infeasible": 1, "failed": 2, "timeout": 3, "refused": 4, "skipped": 5}
BLUE, GREEN, GREY, RED, ORANGE = "#4C72B0", "#55A868", "#9aa4b1", "#C44E52", "#DD8452"
DPI = 100


def write_report(result, cm, out_dir) -> Path:
    """Write `out_dir/index.html` (creating the directory) and return its path. `result` is an
    auto.Comparison, `cm` the CostModel its plans were judged with (for re-simulating timelines)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ParaplanError(f"{out} exists and is not a directory")
    make_dirs(out)
    path = out / "index.html"
    atomic_write_text(path, render(result, cm))
    return path


def render(result, cm) -> str:
    ranked = result.ranked
    best = ranked[0] if ranked else None
    second = ranked[1] if len(ranked) > 1 else None
    model, cluster, batch = _identity(result, cm)
    sims = _Simulations(cm)
    parts = [f"<h1>{_e(model)} on {_e(cluster)}, global batch {_e(batch)}</h1>",
             f'<p class="meta">{_e(_cluster_line(cm))} · in {_e(cm.precision)} · {_e(compared_text(result))} · '
             f"{_e(cm.source)} costs</p>",
             f'<div class="verdict {"" if best else "none"}">{_verdict(result, best, second)}</div>',
             "<h2>Every planner</h2>", _table(result, cm.cluster)]
    shown = [r for r in (best, second) if r is not None]
    if shown:
        parts.append("<h2>Timelines</h2><p>One iteration as the simulator plays it: compute on the upper band "
                     "of each device, communication on the thin band below. Pipeline plans colour forwards blue "
                     "and backwards green, with micro-batch numbers on the bars; operator placements colour "
                     "each operator by the model layer it belongs to.</p>")
        for label, row in zip(("Chosen", "Runner-up"), shown, strict=False):
            parts.append(f"<h3>{label}: {_e(row.planner)}</h3>" + _gantt_html(row, sims))
    memory_rows = shown or _closest_infeasible(result)
    if memory_rows:
        whose = "" if shown else " of the fastest plan found, which does not fit"
        parts.append(f"<h2>Memory per device{whose}</h2><p>Predicted peak per device against its capacity (the "
                     "black tick); a red bar does not fit.</p><div class=\"row\">")
        parts += [f"<figure>{_img(_memory_figure(r, sims), f'memory of {r.planner}')}"
                  f"<figcaption>{_e(r.planner)}</figcaption></figure>" for r in memory_rows]
        parts.append("</div>")
        parts.append(_peak_table(memory_rows[0], sims))
    parts.append(_structure_section(ranked, shown))
    parts.append(_bound_section(result, ranked, best))
    return PAGE.format(title=_e(f"paraplan: {model} on {cluster}"), css=CSS, body="\n".join(parts))


# ----- text -------------------------------------------------------------------------------------

def _e(x) -> str:
    return html.escape(str(x), quote=True)


def fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:  # 4 digits: 15.96 of 16 GiB must not read as full
            return f"{b / size:.4g} {unit}"
    return f"{b:.0f} B"


def _identity(result, cm) -> tuple[str, str, str]:
    """Model, cluster and batch from a plan (what the request recorded), else the cost model."""
    plan = next((r.plan for r in result.rows if r.plan is not None), None)
    if plan is not None:
        return plan.model, plan.cluster, str(plan.global_batch)
    return cm.model.ref or cm.model.name, cm.cluster.name, "?"


def _cluster_line(cm) -> str:
    kinds: dict[str, int] = {}
    for slot in cm.cluster.devices:
        kinds[slot.spec.name] = kinds.get(slot.spec.name, 0) + 1
    return ", ".join(f"{n} × {k}" for k, n in kinds.items()) + f" in {len(cm.cluster.nodes)} node" + (
        "s" if len(cm.cluster.nodes) != 1 else "")


def _verdict(result, best, second) -> str:
    counts = {s: sum(r.status == s for r in result.rows) for s in STATUS_ORDER}
    tally = "; ".join(f"{counts[s]} {w}" for s, w in (
        ("ok", f"of {len(result.rows)} planners found a plan that fits"), ("infeasible", "found plans that do not "
         "fit memory"), ("failed", "failed"), ("timeout", "ran out of time"), ("skipped", "were skipped"))
        if counts[s] and (s != "ok" or best is not None))
    tally = tally[0].upper() + tally[1:] + "." if tally else ""
    bound = result.bound.iteration_s
    if best is None:
        closest = _closest_infeasible(result)
        why = (f" The fastest plan that was found, <b>{_e(closest[0].planner)}</b> ({_e(closest[0].shape)}), "
               f"does not fit: {_e(closest[0].reason)}." if closest else "")
        return (f"<p><b>Nothing fits.</b> No planner found a plan that fits this cluster's memory.{why} "
                f"{tally} No plan can be faster than the lower bound of {fmt_time(bound)}.</p>")
    micro = f" with {best.plan.n_micro} micro-batches" if best.plan is not None and best.plan.n_micro > 1 else ""
    text = (f"<p><b>{_e(best.planner)}</b> is chosen: {_e(best.shape)}{micro}. Predicted "
            f"<b>{fmt_time(best.iteration_s)}</b> per iteration, <b>{best.throughput:,.1f} samples/s</b>, "
            f"{_gap(best.iteration_s, bound)} the lower bound of {fmt_time(bound)}. ")
    if best.split is not None:  # what the gap is made of (simulator/time_split.py)
        parts = against_bound(best.split, result.bound.iteration_s)
        text += f"Per device on average, its time is {_e(parts.describe())}. "
    if second is not None:
        diff = second.iteration_s - best.iteration_s
        text += (f"The runner-up, <b>{_e(second.planner)}</b> ({_e(second.shape)}), "
                 + ("predicts the same time. " if diff <= 1e-12 * best.iteration_s else
                    f"is {fmt_time(diff)} ({diff / best.iteration_s:.1%}) slower. "))
    searched = dict(best.plan.search.options) if best.plan is not None and best.plan.search else {}
    if "schedules_judged" in searched:  # --schedule best: which schedule won, what the next best costs
        text += (f"Its schedule, <b>{_e(best.plan.schedule)}</b>"
                 + (f" with {best.plan.virtual_stages} chunks per device" if best.plan.virtual_stages > 1 else "")
                 + f", won among {searched['schedules_judged']} (schedule, chunks, micro-batches) judged; the next "
                 f"best: {_e(searched['schedule_runner_up'] or 'none')}. ")
    return text + tally + "</p>"


def _gap(t: float, bound: float) -> str:
    return f"{percent(t / bound - 1, 1)} above" if bound > 0 else "compared with"


def _closest_infeasible(result) -> list:
    rows = [r for r in result.rows if r.status == "infeasible" and r.iteration_s is not None]
    return [min(rows, key=lambda r: r.iteration_s)] if rows else []


# ----- the table --------------------------------------------------------------------------------

def _sorted_rows(result) -> list:
    return sorted(result.rows, key=lambda r: (STATUS_ORDER.get(r.status, 9),
                                              r.iteration_s if r.iteration_s is not None else float("inf"),
                                              r.planner))


def _table(result, cluster=None) -> str:
    """Every row; each time column in one unit (report/tables.py: seconds_unit), memory the tightest device's."""
    head = ("planner", "status", "shape", "micro-batches", "iteration", "samples/s", "peak memory (tightest device)",
            "bubble", "search", "reason")
    lines = ["<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    rows = _sorted_rows(result)
    iteration, search = seconds_unit(r.iteration_s for r in rows), seconds_unit(r.search_s for r in rows)
    for r in rows:
        cells = [f"<b>{_e(r.planner)}</b>" + (' <span class="tag">chosen</span>' if r.planner == result.best else ""),
                 f'<span class="status {_e(r.status)}">{_e(r.status)}</span>', _e(r.shape) or "—",
                 str(r.plan.n_micro) if r.plan is not None else "—", in_unit(r.iteration_s, iteration) or "—",
                 f"{r.throughput:,.1f}" if r.throughput is not None else "—", _memory_cell(r, cluster),
                 percent(r.bubble) if r.bubble is not None else "—", in_unit(r.search_s, search) or "—",
                 _e(r.reason)]
        classes = ["nowrap", "", "", "num", "num", "num", "nowrap", "num", "num", "reason"]
        lines.append(f'<tr class="{"best" if r.planner == result.best else ""}">'
                     + "".join(f'<td class="{c}">{x}</td>' for c, x in zip(classes, cells, strict=True)) + "</tr>")
    return "\n".join(lines) + "</tbody></table>"


def _memory_cell(r, cluster=None) -> str:
    """The tightest device's peak / its own capacity, the device named, with a small meter."""
    tight = tightest_memory(r)
    if tight is None:
        return "—"
    _, peak, cap = tight
    share = peak / cap if cap else 0.0
    over = " over" if share > 1 else ""
    return (f'{_e(memory_text(r, cluster))}<span class="meter{over}">'
            f'<span style="width:{min(share, 1) * 100:.0f}%"></span></span>')


# ----- figures ----------------------------------------------------------------------------------

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


def _img(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{_e(alt)}">'


class _Simulations:
    """Each plan simulated once (a timeline and a memory breakdown come from the same run); a plan
    the simulator refuses (an operator placement without the operator graph) is its one-line reason."""

    def __init__(self, cm):
        self.cm = cm
        self.done: dict[str, object] = {}

    def __call__(self, row):
        if row.planner not in self.done:
            try:
                self.done[row.planner] = simulate_plan(row.plan, self.cm)
            except ParaplanError as exc:
                self.done[row.planner] = str(exc)
        return self.done[row.planner]


def _gantt_html(row, sims) -> str:
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
        figure = _img(path.read_bytes(), f"timeline of {row.planner}")
    return figure + (f'<p class="note">{_e(caption[0].upper() + caption[1:])}.</p>' if caption else "")


def _peak_table(row, sims) -> str:
    """What each stage's devices hold at the instant of their peak, by category, heaviest first
    (MemoryBreakdown.at_peak: the parts sum to the peak); '' where the simulator has no breakdown."""
    from paraplan.costs.memory import by_category

    if row.plan is None or row.plan.schedule == "dag":
        return ""
    sim = sims(row)
    if isinstance(sim, str) or not sim.memory:
        return ""
    used, rows = by_category(sim.memory)
    head = ("stage", "devices", "at", *used, "peak")
    lines = [f"<h3>{_e(row.planner)}: memory at each device's peak, by category</h3>",
             "<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        devices = row.plan.stages[r.breakdown.stage].devices
        cells = (str(r.breakdown.stage), f"{devices[0]}..{devices[-1]}" if len(devices) > 1 else str(devices[0]),
                 r.moment, *(fmt_bytes(r.parts[c]) if c in r.parts else "" for c in used),
                 fmt_bytes(r.breakdown.peak_bytes))
        lines.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return "\n".join(lines) + "</tbody></table>"


def _memory_figure(row, sims) -> bytes:
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
    if row.plan is None or row.plan.schedule == "dag":
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


def _structure_section(ranked: list, shown: list) -> str:
    """Per-layer strategies and Bi-Partition ranges: of the plans above, and of the fastest feasible
    plan of each family when neither of those is one (so the page shows what that family chose)."""
    def pick(has) -> list:
        rows = [r for r in shown if r.plan is not None and has(r.plan)]
        first = next((r for r in ranked if r.plan is not None and has(r.plan)), None)
        return rows or ([first] if first is not None else [])

    galvatron = pick(lambda p: any(s.strategies for s in p.stages))
    bipartition = pick(lambda p: any(s.backward_layers is not None for s in p.stages))
    parts = []
    if galvatron:
        parts.append("<h3>Per-layer strategies</h3><p>Each layer's data-parallel (DP), sharded (SDP) and "
                     "tensor-parallel (TP) degrees; hatched layers recompute their activations (CKPT). "
                     "Stages are separated by black lines.</p>" + _img(_strategy_figure(galvatron), "strategies"))
    for r in bipartition:
        same = all(s.backward == s.layers for s in r.plan.stages)
        parts.append(f"<h3>Forward and backward ranges: {_e(r.planner)}</h3><p>Each worker runs the forward of "
                     "one range of layers and the backward of another; hatched layers are recomputed by their "
                     "backward owner." + (" Here the two ranges coincide on every worker: no layer is split, the "
                     "plan is a plain pipeline." if same else "") + "</p>"
                     + _img(_bipartition_figure(r), f"ranges of {r.planner}"))
    return ("<h2>Plan structure</h2>" + "".join(parts)) if parts else ""


def _strategy_figure(rows: list) -> bytes:
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


def _bipartition_figure(row) -> bytes:
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


def _bound_section(result, ranked: list, best) -> str:
    b = result.bound
    text = (f"<h2>Against the lower bound</h2><p>No plan on this cost model can beat <b>{fmt_time(b.iteration_s)}</b>: "
            f"every layer must run forward and backward over the whole batch, which takes at least "
            f"{fmt_time(b.work_s)} of device time (each layer at its cheapest piece size, tensor parallelism "
            f"free), spread perfectly over {b.n_devices} devices with no transfers, bubbles, synchronisation "
            f"or recomputation. The whole batch on one device in one piece takes {fmt_time(b.one_device_s)}."
            + (f" Here memory binds harder: the states and one micro-batch's activations must fit the devices' "
               f"total memory, which allows micro-batches of at most {b.micro_batch} samples and forces "
               f"recomputation; the least work then takes {fmt_time(b.memory_s)} spread over the devices."
               if getattr(b, "binding", "work") == "memory" else "")
            + (f" Operator placements are priced per operator, and their least work, every operator of the whole "
               f"batch on its fastest device, {fmt_time(b.operator_work_s)} of device time, spread over the "
               f"devices is below that: it is the bound." if getattr(b, "binding", "work") == "operators" else "")
            + "</p>")
    if not ranked:
        return text
    return text + _img(_bound_figure(ranked, b.iteration_s, best), "every feasible plan against the lower bound")


def _bound_figure(ranked: list, bound: float, best) -> bytes:
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


CSS = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: #1f2933;
       background: #f5f7fa; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 48px; background: white; }
h1 { font-size: 26px; margin: 8px 0 2px; } h2 { font-size: 20px; margin: 36px 0 8px; border-bottom: 1px solid #e4e7eb;
     padding-bottom: 4px; } h3 { font-size: 16px; margin: 22px 0 6px; }
.meta { color: #616e7c; margin: 0 0 16px; }
.verdict { background: #eef6ee; border-left: 5px solid #55A868; padding: 4px 18px; border-radius: 4px; }
.verdict.none { background: #fbeeee; border-left-color: #C44E52; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; background: #f0f2f5; padding: 6px 8px; white-space: nowrap; position: sticky; top: 0; }
td { padding: 5px 8px; border-top: 1px solid #e4e7eb; vertical-align: top; }
td.nowrap { white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.reason { color: #616e7c; font-size: 12px; max-width: 300px; }
tr.best td { background: #fff5e6; } tr.best td:first-child { box-shadow: inset 4px 0 #DD8452; }
.tag { background: #DD8452; color: white; border-radius: 3px; padding: 0 5px; font-size: 11px; }
.status { border-radius: 3px; padding: 1px 6px; font-size: 12px; }
.status.ok { background: #dff0df; } .status.infeasible { background: #fbe3d0; }
.status.failed, .status.timeout { background: #f6d5d5; } .status.skipped { background: #eceff3; color: #616e7c; }
.meter { display: block; width: 100%; min-width: 90px; height: 4px; background: #e4e7eb; border-radius: 2px; }
.meter span { display: block; height: 4px; background: #4C72B0; border-radius: 2px; }
.meter.over span { background: #C44E52; }
img { max-width: 100%; height: auto; display: block; margin: 8px 0; }
.row { display: flex; gap: 16px; flex-wrap: wrap; } figure { margin: 0; flex: 1 1 0; min-width: 420px; max-width: 620px; }
figcaption { text-align: center; color: #616e7c; font-size: 13px; }
.note { color: #616e7c; font-style: italic; }
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{css}</style></head>
<body><main>
{body}
<p class="meta" style="margin-top:40px">Written by paraplan (plan --planner auto). Predictions are the
simulator's, on the cost model the planners were judged with.</p>
</main></body></html>
"""
