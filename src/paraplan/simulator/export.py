"""A timeline for people (Gantt PNG) and for tools (Chrome trace JSON, opens in Perfetto).

This module writes files; the simulator itself does not.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

from paraplan.simulator.engine import Timeline
from paraplan.system.fileio import atomic_write

COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "backward_part": "#55A868", "send_forward": "#DD8452",
           "send_backward": "#C44E52", "allreduce": "#8172B3", "allgather": "#8172B3", "reducescatter": "#8172B3",
           "op": "#4C72B0", "transfer": "#DD8452", "send_activation": "#937860", "send_weights": "#DA8BC3",
           "backward_weight": "#8DC89B"}  # the weights' half of a split backward: a lighter green
AFTER = "#d9dde3"  # the step after the schedule (optimizer, ZeRO's gather): part of the iteration, no task
MAX_ROWS = 32  # beyond this a chart's rows stop being legible at any height a page shows


def figure_formats() -> list[str]:
    """The file extensions matplotlib can save a figure as (png, svg, pdf, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def figure_format_problem(path: str | Path) -> str | None:
    """Why a figure cannot be saved under this name (its extension), or None; checked before any work."""
    suffix = Path(path).suffix.lower().lstrip(".")
    formats = figure_formats()
    if suffix in formats:
        return None
    what = f"'.{suffix}' is not a figure format" if suffix else "the name has no extension"
    return f"{path}: {what}; use one of {', '.join('.' + f for f in formats)}"


@dataclass(frozen=True)
class GanttRow:
    """One row of a Gantt chart: the devices it stands for and the tasks drawn on it, each
    (task, lane, kind, micro, (layer_start, layer_stop), start, end)."""

    label: str
    devices: tuple[int, ...]
    tasks: tuple
    busy_s: float  # compute time of one of its devices (of its group, for devices that compute together)


@dataclass(frozen=True)
class GanttLayout:
    rows: tuple[GanttRow, ...]
    caption: str  # what the chart leaves out and why ('' when every device has a row of its own)


def gantt(timeline: Timeline, path: str | Path, title: str = "", devices: list[int] | None = None, *,
          plan=None, iteration_s: float | None = None) -> str:
    """`gantt_figure` written to `path` (any format matplotlib saves); returns its caption, what the
    chart left out, for a page to repeat ('' for nothing)."""
    import matplotlib.pyplot as plt

    fig, caption = gantt_figure(timeline, title, devices, plan=plan, iteration_s=iteration_s)
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=130))
    plt.close(fig)
    return caption


def gantt_figure(timeline: Timeline, title: str = "", devices: list[int] | None = None, *,
                 plan=None, iteration_s: float | None = None):
    """The figure and its caption: compute on the upper band of each row (forward blue, backward
    green, micro-batch numbers on the bars; an operator placement's operators coloured by layer),
    communication on the lower band (sends orange/red, collectives purple). The rows are
    `gantt_rows`' (one per distinct device role, at most MAX_ROWS, the busiest always, `plan`
    naming stages and groups); the time axis runs to `iteration_s` where the iteration outlasts its
    schedule (the step after it shaded). The title carries the caption; the caller closes the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = gantt_rows(timeline, plan=plan, devices=devices)
    makespan = timeline.makespan or 1.0
    span = max(makespan, iteration_s or 0.0)
    title = title or f"iteration time {span:.4g} s"
    if layout.caption:
        title += "\n" + "\n".join(textwrap.wrap(layout.caption, 160))
    operators = any(t[2] == "op" for row in layout.rows for t in row.tasks)
    n = max(1, len(layout.rows))
    fig, ax = plt.subplots(figsize=(14 if operators else 12, _row_height(n) * n + 1.8))
    kinds = _draw_operators(ax, layout.rows) if operators else _draw_pipeline(ax, layout.rows, span)
    if span > makespan * (1 + 1e-9):  # the optimizer's step and the rest after the schedule
        ax.axvspan(makespan, span, facecolor=AFTER, hatch="//", edgecolor="white", linewidth=0)
        kinds.add("after")
    _device_axes(ax, layout.rows, span, title)
    if not operators:  # just below the axis label, whatever the chart's height
        _legend(ax, kinds, below=-0.7 / (_row_height(n) * n + 0.4))
    fig.tight_layout()
    return fig, layout.caption


def _row_height(n_rows: int) -> float:
    """Inches per row: thinner as rows add up, so that MAX_ROWS fit a page."""
    return 0.6 if n_rows <= 12 else 0.42 if n_rows <= 24 else 0.32


def gantt_side_by_side(timelines: list[tuple[Timeline, str]], path: str | Path) -> None:
    """Several pipeline timelines, one panel each, on one time axis (the longest), so that their
    lengths and bubbles compare at a glance (`paraplan simulate --schedules --gantt`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = max((t.makespan for t, _ in timelines), default=1.0) or 1.0
    layouts = [gantt_rows(t) for t, _ in timelines]
    heights = [0.45 * len(layout.rows) + 0.6 for layout in layouts]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, sum(heights) + 1.2), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    kinds: set[str] = set()
    for ax, layout, (_, title) in zip(axes[:, 0], layouts, timelines, strict=True):
        kinds |= _draw_pipeline(ax, layout.rows, span, numbers=False)
        _device_axes(ax, layout.rows, span, title + (f"\n{layout.caption}" if layout.caption else ""))
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("time (s)")
    _legend(axes[-1, 0], kinds, below=-0.45 - 0.1 * (3 - min(3, len(layouts[-1].rows))))
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=130))
    plt.close(fig)


def gantt_rows(timeline: Timeline, plan=None, devices: list[int] | None = None,
               max_rows: int = MAX_ROWS) -> GanttLayout:
    """What a chart of a large plan can show: the devices of a stage that compute together
    (per-layer strategies, which the simulator plays on the stage's first device) are one row;
    devices whose timelines are the same up to device ids (data-parallel replicas, a tensor-parallel
    group) collapse into one row labelled with their range and stage; past `max_rows` rows the
    first ones in device order are kept, and the busiest device's always. `plan` (the timeline's
    Plan, optional) names the stages and the groups."""
    per_device: dict[int, dict[tuple[int, str], tuple]] = {}
    for task, device, lane, kind, micro, layers, start, end in timeline.indexed_rows():
        mine = per_device.setdefault(device, {})
        if lane != "recv":  # a transfer is drawn once, on its sender
            mine[task, lane] = (task, lane, kind, micro, layers, start, end)
    if devices is None:  # a device of the plan without a task of its own (its group's compute is drawn on another)
        devices = sorted(set(per_device) | set(getattr(plan, "devices", None) or ()))
    used = list(devices)
    units = _units(used, plan)
    scale = 1e9 / (timeline.makespan or 1.0)  # timelines equal to a billionth of the iteration are the same
    roles: dict[tuple, list[tuple[int, ...]]] = {}
    drawn: dict[tuple, tuple] = {}
    for unit in units:  # a unit: one device, or the devices that compute together
        merged = {key: t for d in unit for key, t in per_device.get(d, {}).items()}  # a group's collective once
        tasks = tuple(sorted(merged.values(), key=lambda t: (t[5], t[0], t[1])))
        key = tuple((lane, kind, micro, layers, round(start * scale), round(end * scale))
                    for _, lane, kind, micro, layers, start, end in tasks)
        roles.setdefault(key, []).append(unit)
        drawn.setdefault(key, tasks)
    rows = []
    for key, members in roles.items():
        ids = tuple(sorted(d for unit in members for d in unit))
        rows.append(GanttRow(_label(ids, plan), ids, drawn[key],
                             sum(t[6] - t[5] for t in drawn[key] if t[1] == "compute")))
    rows.sort(key=lambda r: r.devices[0])
    if not rows:
        return GanttLayout((), "")
    busiest = max(rows, key=lambda r: (r.busy_s, -r.devices[0]))
    shown = rows[:max_rows]
    if busiest not in shown:
        shown = rows[:max_rows - 1] + [busiest]
    if len(rows) > 1:
        shown = [replace(r, label=r.label + ", busiest") if r is busiest else r for r in shown]
    return GanttLayout(tuple(shown), _caption(rows, shown, units, len(used)))


def _units(used: list[int], plan) -> list[tuple[int, ...]]:
    """The devices each row stands for at least: a stage with per-layer strategies computes on
    all of its devices together (one unit; with chunks, a device's stages join theirs); every
    other device is a unit of its own."""
    lead = {d: d for d in used}

    def find(d: int) -> int:
        while lead[d] != d:
            d = lead[d]
        return d

    for stage in getattr(plan, "stages", None) or ():
        group = [d for d in stage.devices if d in lead]
        if stage.strategies:
            for d in group[1:]:
                lead[find(d)] = find(group[0])
    units: dict[int, list[int]] = {}
    for d in used:
        units.setdefault(find(d), []).append(d)
    return [tuple(sorted(u)) for u in units.values()]


def _caption(rows: list[GanttRow], shown: list[GanttRow], units: list[tuple[int, ...]], n_used: int) -> str:
    """What a chart of `shown` out of `rows` leaves out, in words ('' for nothing)."""
    parts = []
    together = [u for u in units if len(u) > 1]
    if together:
        parts.append(f"the devices of a stage with per-layer strategies compute together and share its row "
                     f"({len(together)} group{'s' if len(together) != 1 else ''})")
    unit_size = {d: len(u) for u in units for d in u}
    same = sum(len(r.devices) - unit_size[r.devices[0]] for r in shown)
    if same:
        parts.append(f"{same} device{'s' if same != 1 else ''} with the same timeline as a row shown "
                     f"{'are' if same != 1 else 'is'} not drawn")
    firsts = {r.devices[0] for r in shown}
    left = [r for r in rows if r.devices[0] not in firsts]
    if left:
        n = sum(len(r.devices) for r in left)
        parts.append(f"{len(left)} more row{'s' if len(left) != 1 else ''} of timelines of their own "
                     f"({n} device{'s' if n != 1 else ''}: {_ids([d for r in left for d in r.devices])}) "
                     f"{'are' if len(left) != 1 else 'is'} not drawn")
    if not parts:
        return ""
    return f"{len(shown)} row{'s' if len(shown) != 1 else ''} for {n_used} devices: " + "; ".join(parts)


def _label(ids: tuple[int, ...], plan) -> str:
    """'device 3', 'devices 0-7 (stage 0)', 'devices 0-7 (stages 0, 8)', '16 devices 0, 4, ..., 60 (stage 0)'."""
    text = _ids(ids)
    text = f"device {text}" if len(ids) == 1 else f"{len(ids)} devices {text}" if "..." in text else f"devices {text}"
    members = set(ids)
    stages = [s for s, stage in enumerate(getattr(plan, "stages", None) or ()) if members & set(stage.devices)]
    if stages:
        text += f" (stage {stages[0]})" if len(stages) == 1 else f" (stages {_ids(stages)})"
    return text


def _ids(ids) -> str:
    """0-7; 0-3, 8-11; 0, 8, ..., 56: a set of numbers in a few characters (the count said beside)."""
    ids = sorted(set(ids))
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = [f"{a}-{b}" if b > a else str(a) for a, b in runs]
    if len(text) <= 4:
        return ", ".join(text)
    return f"{text[0]}, {text[1]}, ..., {text[-1]}"


def _draw_pipeline(ax, rows, span: float, numbers: bool = True) -> set[str]:
    """The bars of one pipeline timeline on `ax`, one broken_barh per row, band and colour (one per
    task took seconds at 64 devices); the kinds of task drawn."""
    kinds = set()
    bars: dict[tuple[int, bool, str], list[tuple[float, float]]] = {}
    for y, row in enumerate(rows):
        for _, lane, kind, micro, _layers, start, end in row.tasks:
            kinds.add(kind)
            bars.setdefault((y, lane == "compute", COLOURS.get(kind, "grey")), []).append((start, end - start))
            if numbers and lane == "compute" and micro >= 0 and (end - start) > span / 90:
                ax.text((start + end) / 2, y, str(micro), ha="center", va="center", fontsize=7, color="white")
    for (y, compute, colour), spans in bars.items():
        ax.broken_barh(spans, (y - 0.3, 0.6) if compute else (y + 0.4, 0.22), facecolors=colour,
                       edgecolor="white", linewidth=0.4)
    return kinds


def _legend(ax, kinds: set[str], below: float = -0.22) -> None:
    """Below the axis label, which it would otherwise cover; the weight-gradient pass when drawn."""
    from matplotlib.patches import Patch

    split = "backward_weight" in kinds  # zero-bubble schedules
    handles = [Patch(color=COLOURS["forward"], label="forward"),
               Patch(color=COLOURS["backward"], label="backward (input gradient when split)" if split else "backward")]
    if split:
        handles.append(Patch(color=COLOURS["backward_weight"], label="weight gradient"))
    handles += [Patch(color=COLOURS["send_forward"], label="send activation"),
                Patch(color=COLOURS["send_backward"], label="send gradient"),
                Patch(color=COLOURS["allreduce"], label="all-reduce")]
    if "after" in kinds:
        handles.append(Patch(facecolor=AFTER, hatch="//", label="after the schedule (optimizer step)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below), ncol=len(handles), frameon=False,
              fontsize=8)


def _device_axes(ax, rows, span: float, title: str) -> None:
    """One row per device role, top to bottom, time along x: what both Gantt charts share."""
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.label for r in rows], fontsize=8 if len(rows) > 12 else 10)
    ax.set_ylim(len(rows) - 0.3, -0.5)
    ax.set_xlim(0, span)
    ax.set_xlabel("time (s)")
    ax.set_title(title, fontsize=10)


def _draw_operators(ax, rows) -> set[str]:
    """An operator placement: tens of thousands of boxes stay legible as one band per row,
    operators coloured by the model layer they belong to (a cycle of 20 colours, so neighbouring
    layers differ), transfers on the thin band below. Boxes are drawn in one collection per
    (row, colour): a figure of 80,000 operators takes seconds, not minutes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    palette = plt.get_cmap("tab20").colors
    boxes: dict[tuple[int, int], list] = {}
    sends: dict[int, list] = {}
    n_layers = 0
    for y, row in enumerate(rows):
        for _, lane, _kind, _micro, layers, start, end in row.tasks:
            if lane == "compute":
                boxes.setdefault((y, layers[0] % len(palette)), []).append((start, end - start))
                n_layers = max(n_layers, layers[0] + 1)
            else:
                sends.setdefault(y, []).append((start, end - start))
    for (y, colour), spans in boxes.items():
        ax.broken_barh(spans, (y - 0.3, 0.6), facecolors=palette[colour], linewidth=0)
    for y, spans in sends.items():
        ax.broken_barh(spans, (y + 0.4, 0.22), facecolors=COLOURS["transfer"], linewidth=0)
    handles = [Patch(color=palette[k % len(palette)], label=f"layer {k}") for k in range(min(n_layers, 6))]
    ax.legend(handles=handles + [Patch(color=COLOURS["transfer"], label="transfer")],
              title=f"operators coloured by model layer ({n_layers} layers, 20 colours repeating)",
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(handles) + 1, frameon=False, fontsize=8,
              title_fontsize=8)
    return {"op"}


def chrome_trace(timeline: Timeline, path: str | Path, name: str = "paraplan",
                 task_names: dict[int, str] | None = None) -> None:
    """Chrome trace-event JSON: one process per device, threads compute / send / recv / collective.
    `task_names` names tasks (an operator placement's operators)."""
    tids = {"compute": 0, "send": 1, "recv": 2, "collective": 3}
    events = []
    devices = set()
    task_names = task_names or {}
    for task, device, lane, kind, micro, layers, start, end in timeline.indexed_rows():
        devices.add(device)
        label = task_names.get(task) or (f"{kind} {micro}" if micro >= 0 else kind)
        events.append({"name": label, "cat": kind, "ph": "X",
                       "pid": device, "tid": tids[lane], "ts": start * 1e6, "dur": (end - start) * 1e6,
                       "args": {"micro_batch": micro, "layers": f"{layers[0]}..{layers[1] - 1}"}})
    for d in sorted(devices):
        events.append({"name": "process_name", "ph": "M", "pid": d, "args": {"name": f"device {d}"}})
        for lane, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": d, "tid": tid, "args": {"name": lane}})
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": name}}
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(json.dumps(doc)))
