"""Tables for people (rich) and the number formats they read."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from paraplan.costs.timefn import LayerCosts
from paraplan.hardware.cluster import Cluster
from paraplan.models.spec import ModelSpec


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def human_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def human_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def percent(x: float, digits: int = 0, sign: bool = False) -> str:
    """x as a percentage, never "-0%": a value that rounds to zero prints as zero (a bubble of
    -1e-16 is arithmetic, not a negative bubble)."""
    text = f"{x:{'+' if sign else ''}.{digits}%}"
    if not any(c in "123456789" for c in text):
        text = f"{0.0:{'+' if sign else ''}.{digits}%}"
    return text


def seconds_unit(values) -> tuple[str, float, int]:
    """One unit for a column of durations (`in_unit`): the unit of its median value, so that most
    rows read in their natural unit and none switches to another beside them; and one number of
    decimals, so that the decimal points line up (four digits for the column's largest)."""
    known = sorted(v for v in values if v is not None and v > 0)
    mid = known[len(known) // 2] if known else 1.0
    name, scale = ("s", 1.0) if mid >= 1 else ("ms", 1e-3) if mid >= 1e-3 else ("us", 1e-6)
    top = known[-1] / scale if known else 0.0
    digits = 3 if top < 10 else 2 if top < 100 else 1
    if known and known[0] / scale < 1:  # the smallest keeps two significant digits (a 2 ms search is not "0.00 s")
        import math

        digits = max(digits, min(4, 1 - math.floor(math.log10(known[0] / scale))))
    return name, scale, digits


def in_unit(s: float | None, unit: tuple[str, float, int]) -> str:
    """A duration in its column's unit and decimals (`seconds_unit`); no exponent, ever."""
    if s is None:
        return ""
    name, scale, digits = unit
    return f"{s / scale:,.{digits}f} {name}"


def tightest_memory(row) -> tuple[int, int, int] | None:
    """(device, peak bytes, capacity bytes) of the device of a comparison row nearest its own
    capacity: the largest peak / capacity, not the largest peak over the largest capacity (on a
    mixed cluster a full 32 GiB device beside 40 GiB ones is the one that binds)."""
    if not row.peak_bytes:
        return None
    memory = row.plan.prediction.memory if row.plan is not None and row.plan.prediction is not None else ()
    ids = [m.device for m in memory] if len(memory) == len(row.peak_bytes) else list(range(len(row.peak_bytes)))
    i = max(range(len(ids)), key=lambda k: (row.peak_bytes[k] / max(row.capacity_bytes[k], 1), -k))
    return ids[i], row.peak_bytes[i], row.capacity_bytes[i]


def memory_text(row, cluster: Cluster | None = None, size=None) -> str:
    """'31.92 / 32.00 GiB (dev 5, v100-32gb)': the tightest device's peak over its own capacity, the
    device named (its type where the cluster mixes types); '' without a prediction."""
    tight = tightest_memory(row)
    if tight is None:
        return ""
    device, peak, cap = tight
    size = size or human_bytes
    p, c = size(peak), size(cap)
    same_unit = p.split()[-1] == c.split()[-1]
    kind = (f", {cluster.device(device).name}" if cluster is not None and len(cluster.device_types()) > 1
            and device < cluster.n_devices else "")
    return f"{p.rsplit(' ', 1)[0] if same_unit else p} / {c} (dev {device}{kind})"


def rate(x: float) -> str:
    """A rate as people read it: thousands separated from 100 up, three significant digits below."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def achieved_text(a, flops) -> str:
    """'per GPU: 7,230 tokens/s, 395 TFLOP/s, MFU 39.9% (of the bf16 peak, 989 TFLOP/s; model FLOPs
    6*N + 6*L*d*s per token)' (costs/model_flops.py `Achieved`; no tokens/s for a model without
    tokens). The formula in full is in docs/auto.md and `--json`'s model_flops."""
    tokens = f"{rate(a.tokens_per_s_per_gpu)} tokens/s, " if a.tokens_per_s_per_gpu is not None else ""
    return (f"per GPU: {tokens}{rate(a.tflops_per_gpu)} TFLOP/s, MFU {percent(a.mfu, 1)} (of the {a.precision} "
            f"peak, {rate(a.peak_flops_per_gpu / 1e12)} TFLOP/s; model FLOPs {flops.formula.split(' (')[0]})")


def compared_text(result) -> str:
    """What a comparison compared, in the words the console and the report share: the plans (the
    rows that produced one, fitting or not) and the planners they came from."""
    plans = sum(r.status in ("ok", "infeasible") for r in result.rows)
    cut = [r.planner for r in result.rows if r.timed_out]
    return (f"{plans} plan{'s' if plans != 1 else ''} compared, from {len(result.rows)} planner"
            f"{'s' if len(result.rows) != 1 else ''}, in {result.wall_s:.1f} s"
            + (f"; cut short by the time limit: {', '.join(cut)} (a longer --time-limit may find a better plan)"
               if cut else ""))


def models_table(rows: list[tuple[str, str, int, int, str, str]]) -> Table:
    """The zoo: each entry with the sequence length (or image size) it is planned at by default."""
    table = Table(title="paraplan model zoo (sequence or image: the default size; --seq-len / --image-size change it)",
                  show_lines=False)
    for col, justify in (("model", "left"), ("family", "left"), ("parameters", "right"), ("layers", "right"),
                         ("sequence or image", "right"), ("source", "left")):
        table.add_column(col, justify=justify)
    for name, family, params, n_layers, size, source in rows:
        table.add_row(name, family, human_count(params), str(n_layers), size, source)
    return table


def clusters_table(clusters: list[Cluster]) -> Table:
    """Each preset with its device's peak in the precision the cluster trains in by default (a DGX
    H100's bf16, not the fp32 it never trains in), that precision named."""
    table = Table(title="cluster presets (peak FLOP/s in each cluster's default precision)")
    for col in ("cluster", "devices", "per device", "inside a node", "between nodes", "description"):
        table.add_column(col)
    for c in clusters:
        types = ", ".join(f"{n} x {t}" for t, n in c.device_types().items())
        spec = c.devices[0].spec
        node = c.nodes[0]
        peak = spec.peaks.get(c.default_precision, spec.peak_flops)
        table.add_row(
            c.name, types, f"{peak / 1e12:.3g} TFLOP/s {c.default_precision}, {human_bytes(spec.memory_bytes)}",
            f"{node.intra_link.bandwidth_bytes_per_s / 1e9:.3g} GB/s, {node.intra_link.latency_s * 1e6:.0f} us",
            f"{node.network.bandwidth_bytes_per_s / 1e9:.3g} GB/s, {node.network.latency_s * 1e6:.0f} us"
            if len(c.nodes) > 1 else "-",
            c.description)
    return table


def layers_table(spec: ModelSpec, costs: LayerCosts, batch: int, device_name: str) -> Table:
    table = Table(title=f"{spec.name}: {spec.n_layers} layers, {human_count(spec.param_count)} parameters, "
                        f"{spec.inputs.describe()}; times at micro-batch {batch} on {device_name}")
    for col in ("#", "layer", "kind", "params", "fwd FLOPs/sample", "output/sample", "saved/sample",
                "fwd time", "bwd time", "send output"):
        table.add_column(col, justify="left" if col in ("layer", "kind") else "right")
    fwd, bwd, send, _ = costs.arrays(batch)
    for i, layer in enumerate(spec.layers):
        table.add_row(
            str(i), layer.name, layer.kind,
            human_count(layer.param_count) + (" (+tied)" if layer.shared_param_bytes else ""),
            human_count(layer.forward_flops.per_sample), human_bytes(layer.output_bytes.per_sample),
            human_bytes(layer.saved_bytes.per_sample), human_seconds(fwd[i]), human_seconds(bwd[i]),
            human_seconds(send[i]) if i < spec.n_layers - 1 else "-")
    table.add_section()
    table.add_row("", "total", "", human_count(spec.param_count),
                  human_count(sum(layer.forward_flops.per_sample for layer in spec.layers)),
                  "", human_bytes(spec.activation_bytes_per_sample()),
                  human_seconds(float(fwd.sum())), human_seconds(float(bwd.sum())), "")
    return table


def simulation_table(sim, cluster: Cluster) -> Table:
    pred, plan = sim.prediction, sim.plan
    verdict = "fits in memory" if pred.feasible else f"[bold red]{pred.reason}[/]"
    table = Table(title=f"{plan.model} on {cluster.name} in {plan.precision}: {plan.schedule}, {plan.n_stages} stages, {plan.n_micro} "
                        f"micro-batches of {plan.micro_batch_size:g}, grad sync {plan.grad_sync}\n"
                        f"iteration {human_seconds(pred.iteration_s)}, {pred.throughput_samples_per_s:.4g} samples/s, "
                        f"bubble {percent(sim.bubble_fraction, 1)}; {verdict}")
    for col in ("device", "stage", "busy", "idle", "states", "activations", "stash", "peak memory", "capacity"):
        table.add_column(col, justify="right")
    # one breakdown per pipeline rank, named by its first stage; a rank may hold several stages
    breakdown_of = {d: b for b in sim.memory for d in plan.stages[b.stage].devices}
    peaks = {m.device: m for m in pred.memory}
    for d in sim.devices:
        b = breakdown_of[d.device]
        m = peaks[d.device]
        peak = human_bytes(m.peak_bytes) if m.fits else f"[red]{human_bytes(m.peak_bytes)}[/]"
        table.add_row(str(d.device), stages_label(plan, b.stage), human_seconds(d.busy_s), human_seconds(d.idle_s),
                      human_bytes(b.states_bytes), f"{human_bytes(b.activation_bytes)} ({b.in_flight} in flight)",
                      human_bytes(b.stash_bytes), peak, human_bytes(m.capacity_bytes))
    return table


def schedules_table(sim, compared) -> Table:
    """The plan's pipeline under every schedule (`paraplan simulate --schedules`), fastest that fits
    first; the plan's own schedule marked."""
    plan = sim.plan
    table = Table(title=f"{short_model(plan.model)}: the same {plan.n_ranks}-rank pipeline, {plan.n_micro} micro-batches, "
                        "under each schedule (same cut; with v chunks per rank the model cut into p x v balanced stages)")
    for col in ("schedule", "chunks/rank", "iteration", "vs this plan", "bubble", "peak memory", "fits"):
        table.add_column(col, justify="right" if col not in ("schedule", "fits") else "left")
    base = sim.prediction.iteration_s

    def order(item):
        v, s = item
        return (s is None, s is not None and not s.prediction.feasible, s.prediction.iteration_s if s else 0.0)

    for v, s in sorted(compared, key=order):
        mine = " (this plan)" if (v.kind, v.virtual_stages) == (plan.schedule, plan.virtual_stages) else ""
        if s is None:
            table.add_row(v.label + mine, str(v.virtual_stages), "", "", "", "", f"cannot: {v.reason}")
            continue
        peak = max(m.peak_bytes for m in s.prediction.memory)
        table.add_row(v.label + mine, str(v.virtual_stages), human_seconds(s.prediction.iteration_s),
                      percent(s.prediction.iteration_s / base - 1, 1, sign=True), percent(s.bubble_fraction, 1),
                      human_bytes(peak),
                      "yes" if s.prediction.feasible else f"[red]no: {s.prediction.reason}[/]")
    return table


def short_model(model: str) -> str:
    """A model reference short enough for a title: a long transformers config keeps its type."""
    return model if len(model) <= 40 else model.split("?")[0] + "?..."


def stages_label(plan, first_stage: int) -> str:
    """The stages the rank of `first_stage` holds: "2", or "0,3" with several chunks per rank."""
    ranks = plan.rank_of_stage
    return ",".join(str(s) for s in range(plan.n_stages) if ranks[s] == ranks[first_stage])


def memory_table(sim) -> Table:
    """What each stage's devices hold at the instant of their peak (costs/memory.py:
    MemoryBreakdown.at_peak), by category, heaviest first; each row sums to its peak."""
    from paraplan.costs.memory import by_category

    used, rows = by_category(sim.memory)
    table = Table(title="memory at each device's peak, by category (every device of a stage holds the same)")
    for col in ("stage", "devices", "at", *used, "peak"):
        table.add_column(col, justify="right")
    for r in rows:
        devices = sim.plan.stages[r.breakdown.stage].devices
        shown = ",".join(map(str, devices)) if len(devices) <= 4 else f"{devices[0]}..{devices[-1]} ({len(devices)})"
        table.add_row(stages_label(sim.plan, r.breakdown.stage), shown, r.moment,
                      *(human_bytes(r.parts[c]) if c in r.parts else "" for c in used), human_bytes(r.breakdown.peak_bytes))
    return table


def memory_at_peak(sim) -> list[dict]:
    """`memory_table`'s rows as JSON (`paraplan simulate --json`)."""
    from paraplan.costs.memory import by_category

    return [{"stage": r.breakdown.stage, "devices": list(sim.plan.stages[r.breakdown.stage].devices), "at": r.moment,
             "parts": r.parts, "peak_bytes": r.breakdown.peak_bytes} for r in by_category(sim.memory)[1]]


def profile_report(profile) -> list:
    sizes = profile.batch_sizes
    table = Table(title=f"{profile.model} on {profile.device_name} ({profile.device}, {profile.threads} thread"
                        f"{'s' if profile.threads > 1 else ''}, torch {profile.torch_version}): median of "
                        f"{profile.repeats} after {profile.warmup} warm-up, ± interquartile range")
    table.add_column("layer", justify="left")
    for b in (sizes[0], sizes[-1]):
        table.add_column(f"fwd @{b}", justify="right")
        table.add_column(f"bwd @{b}", justify="right")
    table.add_column(f"s/sample @{sizes[0]} / @{sizes[-1]}", justify="right")
    table.add_column(f"peak memory @{sizes[-1]}", justify="right")
    for layer in profile.layers:
        cells = []
        for k in (0, -1):
            for t in (layer.forward[k], layer.backward[k]):
                cells.append(f"{human_seconds(t.median_s)} ±{t.spread:.0%}")
        peak = human_bytes(layer.peak_bytes[-1]) if layer.peak_bytes else "-"
        table.add_row(layer.name, *cells, f"{layer.nonlinearity():.2f}x", peak)
    lines = [table]
    if profile.step_check is not None:
        c = profile.step_check
        lines.append(f"step check at batch {c.batch}: sum of layers {human_seconds(c.sum_of_layers_s)} vs measured "
                     f"training step {human_seconds(c.measured.median_s)} (±{c.measured.spread:.0%}): gap {c.gap:+.1%}")
    if profile.repeatability:
        import statistics

        r = profile.repeatability
        lines.append(f"repeatability at batch {sizes[-1]} (second run / first, per layer): median "
                     f"{statistics.median(r):.2f}, range {min(r):.2f}..{max(r):.2f}")
    return lines


def links_report(links) -> Table:
    table = Table(title=f"{links.backend}, {links.nproc} processes: point-to-point alpha "
                        f"{human_seconds(links.p2p.latency_s)}, beta {links.p2p.bandwidth_bytes_per_s / 1e9:.3f} GB/s "
                        f"(R^2 {links.p2p.r_squared:.3f}); all-reduce alpha {human_seconds(links.allreduce.latency_s)}, "
                        f"beta {links.allreduce.bandwidth_bytes_per_s / 1e9:.3f} GB/s (R^2 {links.allreduce.r_squared:.3f})")
    for col in ("bytes", "send/recv (median)", "spread", "fit", "all-reduce (median)", "fit"):
        table.add_column(col, justify="right")
    for n, p2p, spread, ar in zip(links.sizes, links.p2p_s, links.p2p_spread, links.allreduce_s, strict=True):
        table.add_row(human_bytes(n), human_seconds(p2p), f"{spread:.0%}",
                      human_seconds(links.p2p.latency_s + n / links.p2p.bandwidth_bytes_per_s), human_seconds(ar),
                      human_seconds(links.allreduce.latency_s + n / links.allreduce.bandwidth_bytes_per_s))
    return table


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, width=200 if not stderr else None)


def dag_table(sim, cluster: Cluster, graph=None) -> Table:
    """An operator-placement plan (FD-DPS): per device its operators, busy time and memory, and
    the critical path (simulator/dag.py)."""
    pred, plan, run = sim.prediction, sim.plan, sim.dag
    verdict = "fits in memory" if pred.feasible else f"[bold red]{pred.reason}[/]"
    n_ops = sum(len(p.ops) for p in plan.operators)
    path = ""
    if run is not None and run.critical_path:
        names = [graph.nodes[i].name for i in run.critical_path] if graph is not None else []
        ends = f": {names[0]} … {names[-1]}" if names else ""
        path = (f"\ncritical path: {len(run.critical_path)} operators, {human_seconds(run.critical_compute_s)} "
                f"computing + {human_seconds(run.critical_transfer_s)} waiting for transfers{ends}")
    table = Table(title=f"{plan.model} on {cluster.name}: operator placement of {n_ops} operators on "
                        f"{len(plan.operators)} devices, batch {plan.global_batch}\n"
                        f"iteration {human_seconds(pred.iteration_s)}, {pred.throughput_samples_per_s:.4g} samples/s, "
                        f"idle {percent(sim.bubble_fraction, 1)}; {verdict}{path}")
    for col in ("device", "operators", "busy", "idle", "peak memory", "capacity"):
        table.add_column(col, justify="right")
    peaks = {m.device: m for m in pred.memory}
    for d in sim.devices:
        m = peaks[d.device]
        peak = human_bytes(m.peak_bytes) if m.fits else f"[red]{human_bytes(m.peak_bytes)}[/]"
        count = int(run.n_ops[d.device]) if run is not None else 0
        table.add_row(str(d.device), str(count), human_seconds(d.busy_s), human_seconds(d.idle_s), peak,
                      human_bytes(m.capacity_bytes))
    return table


_STATUS_ORDER = {"ok": 0, "infeasible": 1, "failed": 2, "timeout": 3, "refused": 4, "skipped": 5}


def auto_table(result, title: str, cluster: Cluster | None = None, flops=None) -> Table:
    """Every planner's row of `paraplan plan --planner auto` (paraplan/planners/auto.py Comparison): feasible
    plans fastest first, the chosen one marked, then the rest with why. Each time column has one
    unit (`seconds_unit`); memory is the tightest device's (`memory_text`); with the model's FLOPs
    (costs/model_flops.py) and the cluster, each plan's MFU beside its samples/s."""
    rows = sorted(result.rows, key=lambda r: (_STATUS_ORDER.get(r.status, 9),
                                              r.iteration_s if r.iteration_s is not None else float("inf"), r.planner))
    iteration = seconds_unit(r.iteration_s for r in rows)
    search = seconds_unit(r.search_s for r in rows)
    t = Table(title=title)
    mfu = flops is not None and cluster is not None
    for col in ("planner", "shape", "micro", "iteration", "samples/s", *(("MFU",) if mfu else ()),
                "peak memory (tightest device)", "bubble", "search", "verdict"):
        t.add_column(col, justify="right" if col in ("micro", "iteration", "samples/s", "MFU", "bubble", "search")
                     else "left")
    for r in rows:
        best = r.planner == result.best
        verdict = "best" if best else ("feasible" if r.status == "ok" else f"{r.status}: {r.reason}")
        if r.timed_out and r.plan is not None:  # the search was stopped: say the plan is its best so far
            verdict += f" ({r.reason})" if r.status == "ok" else ""
        t.add_row(("* " if best else "") + r.planner, r.shape, str(r.plan.n_micro) if r.plan else "",
                  in_unit(r.iteration_s, iteration), f"{r.throughput:.4g}" if r.throughput is not None else "",
                  *((row_mfu(r, flops, cluster),) if mfu else ()), memory_text(r, cluster),
                  percent(r.bubble) if r.bubble is not None else "",
                  in_unit(r.search_s, search), verdict,
                  style="bold green" if best else ("dim" if r.status in ("skipped",) else None))
    return t


def row_achieved(row, flops, cluster):
    """A comparison row's tokens/s, TFLOP/s and MFU per GPU (costs/model_flops.py), None without a plan."""
    from paraplan.costs.model_flops import plan_achieved

    if row.plan is None or row.throughput is None:
        return None
    return plan_achieved(flops, row.plan, cluster, row.throughput)


def row_mfu(row, flops, cluster) -> str:
    a = row_achieved(row, flops, cluster)
    return percent(a.mfu, 1) if a is not None else ""
