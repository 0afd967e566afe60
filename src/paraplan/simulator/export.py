"""A timeline for people (Gantt PNG) and for tools (Chrome trace JSON, opens in Perfetto).

This module writes files; the simulator itself does not.
"""

from __future__ import annotations

import json
from pathlib import Path

from paraplan.simulator.engine import Timeline
from paraplan.system.fileio import atomic_write

COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "backward_part": "#55A868", "send_forward": "#DD8452",
           "send_backward": "#C44E52", "allreduce": "#8172B3", "allgather": "#8172B3", "reducescatter": "#8172B3",
           "op": "#4C72B0", "transfer": "#DD8452", "send_activation": "#937860", "send_weights": "#DA8BC3",
           "backward_weight": "#8DC89B"}  # the weights' half of a split backward: a lighter green
LANE_OFFSETS = {"compute": 0.0, "send": 0.34, "recv": 0.34, "collective": 0.34}


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


def gantt(timeline: Timeline, path: str | Path, title: str = "", devices: list[int] | None = None) -> None:
    """One row per device: compute on the upper band (forward blue, backward green, micro-batch
    numbers on the bars), communication on the lower band (sends orange/red, collectives purple)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(timeline.rows())
    if any(r[2] == "op" for r in rows):
        return _gantt_operators(rows, timeline.makespan or 1.0, path, title, devices)
    used = sorted({r[0] for r in rows}) if devices is None else devices
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(used) + 1.6))
    kinds = _draw_pipeline(ax, rows, used, timeline.makespan or 1.0, title)
    _legend(ax, kinds)
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=130))
    plt.close(fig)


def gantt_side_by_side(timelines: list[tuple[Timeline, str]], path: str | Path) -> None:
    """Several pipeline timelines, one panel each, on one time axis (the longest), so that their
    lengths and bubbles compare at a glance (`paraplan simulate --schedules --gantt`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = max((t.makespan for t, _ in timelines), default=1.0) or 1.0
    all_rows = [list(t.rows()) for t, _ in timelines]
    used = [sorted({r[0] for r in rows}) for rows in all_rows]
    heights = [0.45 * len(u) + 0.6 for u in used]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, sum(heights) + 1.2), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    kinds: set[str] = set()
    for ax, rows, devices, (_, title) in zip(axes[:, 0], all_rows, used, timelines, strict=True):
        kinds |= _draw_pipeline(ax, rows, devices, span, title, numbers=False)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("time (s)")
    _legend(axes[-1, 0], kinds, below=-0.45 - 0.1 * (3 - min(3, len(used[-1]))))
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=130))
    plt.close(fig)


def _draw_pipeline(ax, rows, used: list[int], span: float, title: str, numbers: bool = True) -> set[str]:
    """The bars of one pipeline timeline on `ax`; the kinds of task drawn."""
    index = {d: i for i, d in enumerate(used)}
    kinds = set()
    for device, lane, kind, micro, _layers, start, end in rows:
        if device not in index or (lane == "recv"):
            continue  # a transfer is drawn once, on its sender
        kinds.add(kind)
        y = index[device] + LANE_OFFSETS[lane]
        height = 0.6 if lane == "compute" else 0.22
        y0 = y - 0.3 if lane == "compute" else y + 0.06
        ax.broken_barh([(start, end - start)], (y0, height), facecolors=COLOURS.get(kind, "grey"),
                       edgecolor="white", linewidth=0.4)
        if numbers and lane == "compute" and micro >= 0 and (end - start) > span / 90:
            ax.text((start + end) / 2, y0 + height / 2, str(micro), ha="center", va="center", fontsize=7,
                    color="white")
    _device_axes(ax, used, span, title)
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
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below), ncol=len(handles), frameon=False,
              fontsize=8)


def _device_axes(ax, used: list[int], span: float, title: str) -> None:
    """One row per device, top to bottom, time along x: what both Gantt charts share."""
    ax.set_yticks(range(len(used)))
    ax.set_yticklabels([f"device {d}" for d in used])
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"iteration time {span:.4g} s")


def _gantt_operators(rows, span: float, path, title: str, devices) -> None:
    """An operator placement: tens of thousands of boxes stay legible as one band per device,
    operators coloured by the model layer they belong to (a cycle of 20 colours, so neighbouring
    layers differ), transfers on the thin band below. Boxes are drawn in one collection per
    (device, colour): a figure of 80,000 operators takes seconds, not minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    palette = plt.get_cmap("tab20").colors
    used = sorted({r[0] for r in rows}) if devices is None else devices
    index = {d: i for i, d in enumerate(used)}
    boxes: dict[tuple[int, int], list] = {}
    sends: dict[int, list] = {}
    n_layers = 0
    for device, lane, _kind, _micro, layers, start, end in rows:
        if device not in index or lane == "recv":
            continue
        if lane == "compute":
            boxes.setdefault((device, layers[0] % len(palette)), []).append((start, end - start))
            n_layers = max(n_layers, layers[0] + 1)
        else:
            sends.setdefault(device, []).append((start, end - start))
    fig, ax = plt.subplots(figsize=(14, 0.6 * len(used) + 1.6))
    for (device, colour), spans in boxes.items():
        ax.broken_barh(spans, (index[device] - 0.3, 0.6), facecolors=palette[colour], linewidth=0)
    for device, spans in sends.items():
        ax.broken_barh(spans, (index[device] + 0.34 + 0.06, 0.22), facecolors=COLOURS["transfer"], linewidth=0)
    _device_axes(ax, used, span, title)
    handles = [Patch(color=palette[k % len(palette)], label=f"layer {k}") for k in range(min(n_layers, 6))]
    ax.legend(handles=handles + [Patch(color=COLOURS["transfer"], label="transfer")],
              title=f"operators coloured by model layer ({n_layers} layers, 20 colours repeating)",
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(handles) + 1, frameon=False, fontsize=8,
              title_fontsize=8)
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=130))
    plt.close(fig)


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
