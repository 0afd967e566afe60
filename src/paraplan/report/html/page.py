"""The HTML report's page (report/html/__init__.py): the verdict, every planner's row, the
timelines, memory per device and what each device holds at its peak, the plans' structure and
every feasible plan against the lower bound, in one self-contained page."""

from __future__ import annotations

from pathlib import Path

from paraplan.errors import ParaplanError
from paraplan.plans.kinds import PlanKind
from paraplan.report.html.figures import (
    bipartition_figure,
    bound_figure,
    gantt_html,
    img,
    memory_figure,
    strategy_figure,
)
from paraplan.report.html.text import escape as _e
from paraplan.report.html.text import fmt_bytes, fmt_time
from paraplan.report.tables import (
    achieved_text,
    compared_text,
    in_unit,
    memory_text,
    percent,
    row_achieved,
    row_mfu,
    seconds_unit,
    tightest_memory,
)
from paraplan.simulator.predict import simulate_plan
from paraplan.simulator.time_split import against_bound
from paraplan.system.fileio import atomic_write_text, make_dirs

STATUS_ORDER = {"ok": 0, "infeasible": 1, "failed": 2, "timeout": 3, "refused": 4, "skipped": 5}


def write_report(result, cm, out_dir, flops=None, ladder: dict | None = None) -> Path:
    """Write `out_dir/index.html` (creating the directory) and return its path. `result` is an
    auto.Comparison, `cm` the CostModel its plans were judged with (for re-simulating timelines),
    `flops` the model's FLOPs per sample for MFU (costs/model_flops.py; by default counted from the
    measured forward FLOPs, which knows no decoder's closed form: workload.model_flops_of does);
    `ladder`: a fallback ladder's document (planners/ladder.py: ladder_document), `result` its rung 0's
    comparison, the rungs shown in a section of their own."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ParaplanError(f"{out} exists and is not a directory")
    make_dirs(out)
    path = out / "index.html"
    atomic_write_text(path, render(result, cm, flops, ladder))
    return path


def render(result, cm, flops=None, ladder: dict | None = None) -> str:
    from paraplan.costs.model_flops import model_flops

    flops = flops if flops is not None else model_flops(cm.model)
    ranked = result.ranked
    best = ranked[0] if ranked else None
    second = ranked[1] if len(ranked) > 1 else None
    model, cluster, batch = _identity(result, cm)
    sims = _Simulations(cm)
    parts = [f"<h1>{_e(model)} on {_e(cluster)}, global batch {_e(batch)}</h1>",
             f'<p class="meta">{_e(_cluster_line(cm))} · in {_e(cm.precision)} · {_e(compared_text(result))} · '
             f"{_e(cm.source)} costs</p>",
             f'<div class="verdict {"" if best else "none"}">{_verdict(result, best, second, flops, cm.cluster)}</div>',
             _experts_line(best, cm),
             _ladder_section(ladder) if ladder else "<h2>Every planner</h2>", _table(result, cm.cluster, flops)]
    shown = [r for r in (best, second) if r is not None]
    if shown:
        parts.append("<h2>Timelines</h2><p>One iteration as the simulator plays it: compute on the upper band "
                     "of each device, communication on the thin band below. Pipeline plans colour forwards blue "
                     "and backwards green, with micro-batch numbers on the bars; operator placements colour "
                     "each operator by the model layer it belongs to.</p>")
        for label, row in zip(("Chosen", "Runner-up"), shown, strict=False):
            parts.append(f"<h3>{label}: {_e(row.planner)}</h3>" + gantt_html(row, sims))
    memory_rows = shown or _closest_infeasible(result)
    if memory_rows:
        whose = "" if shown else " of the fastest plan found, which does not fit"
        parts.append(f"<h2>Memory per device{whose}</h2><p>Predicted peak per device against its capacity (the "
                     "black tick); a red bar does not fit.</p><div class=\"row\">")
        parts += [f"<figure>{img(memory_figure(r, sims), f'memory of {r.planner}')}"
                  f"<figcaption>{_e(r.planner)}</figcaption></figure>" for r in memory_rows]
        parts.append("</div>")
        parts.append(_peak_table(memory_rows[0], sims))
    parts.append(_structure_section(ranked, shown))
    parts.append(_bound_section(result, ranked, best))
    return PAGE.format(title=_e(f"paraplan: {model} on {cluster}"), css=CSS, body="\n".join(parts))


def _experts_line(best, cm) -> str:
    """A mixture of experts: the chosen plan's expert layout and its all-to-alls' share of the step
    (simulator/experts.py); nothing for a dense model."""
    from paraplan.simulator.experts import expert_summary

    experts = expert_summary(best.plan, cm, best.iteration_s) if best is not None and best.plan is not None else None
    return f'<p class="meta">{_e(experts.describe())}</p>' if experts is not None else ""


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


def _verdict(result, best, second, flops, cluster) -> str:
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
    per_gpu = row_achieved(best, flops, cluster)
    if per_gpu is not None:  # what users compare runs by (costs/model_flops.py)
        said = achieved_text(per_gpu, flops)
        text += f"{_e(said[0].upper() + said[1:])}. "
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


def _table(result, cluster, flops) -> str:
    """Every row; each time column in one unit (report/tables.py: seconds_unit), memory the tightest
    device's; MFU beside samples/s (costs/model_flops.py, its formula in the column's title)."""
    from paraplan.costs.model_flops import MFU_FORMULA

    head = ("planner", "status", "shape", "micro-batches", "iteration", "samples/s", "MFU",
            "peak memory (tightest device)", "bubble", "search", "reason")
    mfu_title = f' title="{_e(MFU_FORMULA)}; model FLOPs: {_e(flops.formula)}"'
    lines = ["<table><thead><tr>" + "".join(f"<th{mfu_title if h == 'MFU' else ''}>{h}</th>" for h in head)
             + "</tr></thead><tbody>"]
    rows = _sorted_rows(result)
    iteration, search = seconds_unit(r.iteration_s for r in rows), seconds_unit(r.search_s for r in rows)
    for r in rows:
        cells = [f"<b>{_e(r.planner)}</b>" + (' <span class="tag">chosen</span>' if r.planner == result.best else ""),
                 f'<span class="status {_e(r.status)}">{_e(r.status)}</span>', _e(r.shape) or "—",
                 str(r.plan.n_micro) if r.plan is not None else "—", in_unit(r.iteration_s, iteration) or "—",
                 f"{r.throughput:,.1f}" if r.throughput is not None else "—", row_mfu(r, flops, cluster) or "—",
                 _memory_cell(r, cluster),
                 percent(r.bubble) if r.bubble is not None else "—", in_unit(r.search_s, search) or "—",
                 _e(r.reason)]
        classes = ["nowrap", "", "", "num", "num", "num", "num", "nowrap", "num", "num", "reason"]
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


def _peak_table(row, sims) -> str:
    """What each stage's devices hold at the instant of their peak, by category, heaviest first
    (MemoryBreakdown.at_peak: the parts sum to the peak); '' where the simulator has no breakdown."""
    from paraplan.costs.memory import by_category

    if row.plan is None or row.plan.kind is PlanKind.OPERATORS:
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


def _structure_section(ranked: list, shown: list) -> str:
    """Per-layer strategies and Bi-Partition ranges: of the plans above, and of the fastest feasible
    plan of each family when neither of those is one (so the page shows what that family chose)."""
    def pick(has) -> list:
        rows = [r for r in shown if r.plan is not None and has(r.plan)]
        first = next((r for r in ranked if r.plan is not None and has(r.plan)), None)
        return rows or ([first] if first is not None else [])

    galvatron = pick(lambda p: p.kind is PlanKind.LAYERS)
    bipartition = pick(lambda p: p.kind is PlanKind.BIPARTITION)
    parts = []
    if galvatron:
        parts.append("<h3>Per-layer strategies</h3><p>Each layer's data-parallel (DP), sharded (SDP) and "
                     "tensor-parallel (TP) degrees; hatched layers recompute their activations (CKPT). "
                     "Stages are separated by black lines.</p>" + img(strategy_figure(galvatron), "strategies"))
    for r in bipartition:
        same = all(s.backward == s.layers for s in r.plan.stages)
        parts.append(f"<h3>Forward and backward ranges: {_e(r.planner)}</h3><p>Each worker runs the forward of "
                     "one range of layers and the backward of another; hatched layers are recomputed by their "
                     "backward owner." + (" Here the two ranges coincide on every worker: no layer is split, the "
                     "plan is a plain pipeline." if same else "") + "</p>"
                     + img(bipartition_figure(r), f"ranges of {r.planner}"))
    return ("<h2>Plan structure</h2>" + "".join(parts)) if parts else ""


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
    return text + img(bound_figure(ranked, b.iteration_s, best), "every feasible plan against the lower bound")


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


def _ladder_section(ladder: dict) -> str:
    """The fallback ladder's rungs: each one's best plan, its throughput against the whole cluster's,
    what switching to it reads and costs, its goodput (cli/plan_ladder.py prints the same table)."""
    rungs = ladder["rungs"]
    full = rungs[0]["throughput_samples_per_s"]
    rows = []
    for k, r in enumerate(rungs):
        switch, good = r.get("switch"), r.get("goodput")
        cells = [str(k), ", ".join(r["dropped"]) or "-", str(r["devices"]), r["planner"] or "nothing fits",
                 f"{r['iteration_s']:.4g} s" if r["iteration_s"] else "-",
                 f"{r['throughput_samples_per_s']:.4g}" if r["throughput_samples_per_s"] else "-",
                 f"{r['throughput_samples_per_s'] / full:.0%}" if r["throughput_samples_per_s"] and full else "-",
                 fmt_bytes(switch['most_read_bytes']) if switch else "-",
                 f"{switch['restart_s']:.3g} s" if switch else "-",
                 f"{good['samples_per_s']:.4g} ({good['useful']:.1%})" if good else "-"]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("rung", "without", "devices", "best planner", "iteration", "samples/s",
                                             "vs all", "reads", "restart", "goodput"))
    whole = ladder.get("ladder_goodput_samples_per_s")
    return ("<h2>Fallback ladder</h2><p>The best plan with every node and with fewer, each for the same global "
            f"batch; a node failing every {ladder['node_mtbf_h']:,.0f} h on average. Reads: the most any device "
            "reads from the last checkpoint to load the rung's plan; restart: those reads at the storage's "
            "bandwidth, then one iteration; goodput: samples/s trained usefully with checkpoints at Young's "
            "interval." + (f" The ladder's until its last rung fails: {whole:.4g} samples/s." if whole else "")
            + f"</p><table><tr>{head}</tr>{''.join(rows)}</table><h2>Every planner, with every node</h2>")
