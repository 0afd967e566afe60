"""Plans on disk: versioned JSON, validated on load with errors that name the file and field."""

from __future__ import annotations

import json
from pathlib import Path

from paraplan.plans.axes import EXPERT_FIELDS, LAYER_AXES, LAYOUT_AXES, SEQUENCE, ZERO
from paraplan.plans.plan import (
    DEFAULT_ORDER,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    DeviceMemory,
    LayerRange,
    LayerStrategy,
    OperatorPlacement,
    Plan,
    PlanError,
    Prediction,
    SearchInfo,
    Stage,
    validate,
)
from paraplan.plans.prediction import PRICED_BY
from paraplan.system.fileio import atomic_write_text, is_finite_number, read_text

# a strategy's keys are the axes' names (plans/axes.py): the layout axes always, in the order files
# have always had them (dp, sdp, tp); the axes outside the layout (cp) and the expert view's (ep, etp)
# optional, after the refinements
_FILE_AXES = tuple(reversed(LAYOUT_AXES))
_OPTIONAL_AXES = (*(a for a in LAYER_AXES if not a.in_layout), *EXPERT_FIELDS)


def _strategy_to_dict(x: LayerStrategy) -> dict:
    layout = {a.name: x.degree_of(a) for a in _FILE_AXES}
    out = {**layout, "recompute": str(x.recompute)}
    if x.order != LayerStrategy(**layout).order:  # optional: the default layout is left out
        out["order"] = x.order
    # optional, left out at their defaults: the ZeRO stage of the dp replicas, sequence parallelism, cp, ep, etp
    optional = [(r.field, x.refinement_value(r)) for r in (ZERO, SEQUENCE)]
    optional += [(a.name, x.degree_of(a)) for a in _OPTIONAL_AXES]
    out.update({k: v for k, v in optional if v != getattr(LayerStrategy, k)})
    return out


def plan_to_dict(plan: Plan) -> dict:
    def rng(r: LayerRange | None):
        return None if r is None else [r.start, r.stop]

    out: dict = {
        "format_version": plan.format_version,
        "model": plan.model,
        "cluster": plan.cluster,
        "n_layers": plan.n_layers,
        "global_batch": plan.global_batch,
        "n_micro": plan.n_micro,
        "precision": str(plan.precision),
        "schedule": {"kind": str(plan.schedule), "virtual_stages": plan.virtual_stages,
                     **({"stage_ranks": list(plan.stage_ranks)} if plan.stage_ranks else {}),
                     **({"actions": [list(a) for a in plan.actions]} if plan.actions else {}),
                     **({"expert_overlap": True} if plan.expert_overlap else {})},
        "grad_sync": plan.grad_sync,
        **({"expert_dispatcher": plan.expert_dispatcher} if plan.expert_dispatcher != "alltoall" else {}),
        **({"fp8_recipe": plan.fp8_recipe} if plan.fp8_recipe else {}),
        **({"fp8_param_gather": True} if plan.fp8_param_gather else {}),
        "stages": [
            {
                "layers": rng(s.layers),
                "devices": list(s.devices),
                **({"backward_layers": rng(s.backward_layers)} if s.backward_layers is not None else {}),
                **({"strategies": [_strategy_to_dict(x) for x in s.strategies]} if s.strategies else {}),
                **({"shares": list(s.shares)} if s.shares else {}),
            }
            for s in plan.stages
        ],
    }
    if any(s.backward_layers is not None for s in plan.stages):
        out["split_layers"] = plan.split_layers
    if plan.operators:
        out["operators"] = [{"device": p.device, "ops": list(p.ops)} for p in plan.operators]
    if plan.prediction is not None:
        p = plan.prediction
        out["prediction"] = {
            "iteration_s": p.iteration_s,
            "throughput_samples_per_s": p.throughput_samples_per_s,
            "feasible": p.feasible,
            "reason": p.reason,
            "memory": [{"device": m.device, "peak_bytes": m.peak_bytes, "capacity_bytes": m.capacity_bytes}
                       for m in p.memory],
        }
        if p.cost_source:  # optional: files without it (and older files) load with ""
            out["prediction"]["cost_source"] = p.cost_source
        if p.engine != "paraplan":  # optional: files without it (and older files) were priced as paraplan runs
            out["prediction"]["engine"] = p.engine
    if plan.search is not None:
        out["search"] = {"planner": plan.search.planner, "search_s": plan.search.search_s,
                         "options": dict(plan.search.options)}
        if plan.search.note:  # optional: files without it (and older files) load with ""
            out["search"]["note"] = plan.search.note
    return out


class _Reader:
    """Typed field access that names the field on every error."""

    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, where: str, message: str):
        raise PlanError(f"{self.origin}: {where}: {message}")

    def table(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected an object, got {type(value).__name__}")
        return value

    def get(self, table: dict, key: str, where: str, kind, default=...):
        if key not in table:
            if default is ...:
                self.fail(f"{where}{key}", "missing")
            return default
        value = table[key]
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(f"{where}{key}", f"expected an integer, got {value!r}")
        elif kind is float:
            if not is_finite_number(value):
                self.fail(f"{where}{key}", f"expected a number, got {value!r}")
            value = float(value)
        elif kind is bool:
            if not isinstance(value, bool):
                self.fail(f"{where}{key}", f"expected true or false, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                self.fail(f"{where}{key}", f"expected a string, got {value!r}")
        elif kind is list:
            if not isinstance(value, list):
                self.fail(f"{where}{key}", f"expected a list, got {value!r}")
        return value

    def layer_range(self, value, where: str) -> LayerRange:
        if (not isinstance(value, list) or len(value) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            self.fail(where, f"expected [start, stop] layer indices, got {value!r}")
        return LayerRange(value[0], value[1])

    def int_list(self, value, where: str, what: str = "device ids") -> tuple[int, ...]:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            self.fail(where, f"expected a list of {what}, got {value!r}")
        return tuple(value)


def plan_from_dict(data: object, origin: str = "plan") -> Plan:
    r = _Reader(origin)
    d = r.table(data, "top level")
    version = d.get("format_version")
    if d.get("format") == "paraplan.ladder":  # plans/ladder_file.py: a rung of it is a plan
        r.fail("format", "a fallback ladder, not a plan: paraplan train takes it with the rung to run; the plan "
                         "file written beside it is its rung 0")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        r.fail("format_version", f"expected {' or '.join(map(str, READABLE_VERSIONS))}, got {version!r}")
    stages = []
    for i, s in enumerate(r.get(d, "stages", "", list, [])):
        w = f"stages[{i}]."
        s = r.table(s, w[:-1])
        strategies = []
        for j, x in enumerate(r.get(s, "strategies", w, list, [])):
            wx = f"{w}strategies[{j}]."
            x = r.table(x, wx[:-1])
            strategies.append(_strategy(r, x, wx, version))
        backward = s.get("backward_layers")
        stages.append(Stage(
            layers=r.layer_range(r.get(s, "layers", w, list), f"{w}layers"),
            devices=r.int_list(r.get(s, "devices", w, list), f"{w}devices"),
            backward_layers=None if backward is None else r.layer_range(backward, f"{w}backward_layers"),
            strategies=tuple(strategies),
            shares=r.int_list(s["shares"], f"{w}shares", "shares") if "shares" in s else (),
        ))
    operators = []
    for i, p in enumerate(r.get(d, "operators", "", list, [])):
        w = f"operators[{i}]."
        p = r.table(p, w[:-1])
        ops = r.get(p, "ops", w, list)
        if not all(isinstance(o, str) for o in ops):
            r.fail(f"{w}ops", "expected a list of operator names")
        operators.append(OperatorPlacement(device=r.get(p, "device", w, int), ops=tuple(ops)))
    prediction = None
    if d.get("prediction") is not None:
        p = r.table(d["prediction"], "prediction")
        memory = []
        for i, m in enumerate(r.get(p, "memory", "prediction.", list, [])):
            w = f"prediction.memory[{i}]."
            m = r.table(m, w[:-1])
            memory.append(DeviceMemory(device=r.get(m, "device", w, int), peak_bytes=r.get(m, "peak_bytes", w, int),
                                       capacity_bytes=r.get(m, "capacity_bytes", w, int)))
        prediction = Prediction(
            iteration_s=r.get(p, "iteration_s", "prediction.", float),
            throughput_samples_per_s=r.get(p, "throughput_samples_per_s", "prediction.", float),
            memory=tuple(memory), feasible=r.get(p, "feasible", "prediction.", bool, True),
            reason=r.get(p, "reason", "prediction.", str, ""),
            cost_source=r.get(p, "cost_source", "prediction.", str, ""),
            engine=r.get(p, "engine", "prediction.", str, "paraplan"))
        if prediction.engine not in PRICED_BY:
            r.fail("prediction.engine", f"unknown engine {prediction.engine!r}; expected one of {', '.join(PRICED_BY)}")
    search = None
    if d.get("search") is not None:
        s = r.table(d["search"], "search")
        options = r.table(s.get("options", {}), "search.options")
        for k, v in options.items():
            if not isinstance(v, (str, int, float, bool)):
                r.fail(f"search.options.{k}", f"expected a string, number or boolean, got {v!r}")
        search = SearchInfo(planner=r.get(s, "planner", "search.", str), search_s=r.get(s, "search_s", "search.", float),
                            options=tuple(sorted(options.items())), note=r.get(s, "note", "search.", str, ""))
    model, cluster = r.get(d, "model", "", str), r.get(d, "cluster", "", str)
    n_layers, global_batch, n_micro = (r.get(d, key, "", int) for key in ("n_layers", "global_batch", "n_micro"))
    schedule = _schedule(r, d, version)
    plan = Plan(
        model=model, cluster=cluster, n_layers=n_layers, global_batch=global_batch, n_micro=n_micro,
        schedule=schedule["kind"],
        grad_sync=r.get(d, "grad_sync", "", str, "after-backward"), stages=tuple(stages),
        split_layers=r.get(d, "split_layers", "", str, "recompute"),
        operators=tuple(operators), prediction=prediction, search=search, format_version=FORMAT_VERSION,
        precision=r.get(d, "precision", "", str, "fp32") if version >= 2 else "fp32",
        virtual_stages=schedule["virtual_stages"], stage_ranks=schedule["stage_ranks"], actions=schedule["actions"],
        expert_overlap=schedule["expert_overlap"],
        # optional (plans/expert_dispatch.py): files without it dispatch every routed copy (alltoall)
        expert_dispatcher=r.get(d, "expert_dispatcher", "", str, "alltoall"),
        fp8_recipe=r.get(d, "fp8_recipe", "", str, ""),
        fp8_param_gather=r.get(d, "fp8_param_gather", "", bool, False),
    )
    try:
        return validate(plan)
    except PlanError as exc:
        raise PlanError(f"{origin}: {exc}") from None


def _strategy(r: _Reader, x: dict, wx: str, version: int) -> LayerStrategy:
    """One layer's strategy; version 1 says `checkpoint` (true: full recomputation), version 2
    `recompute` (none | selective | full) and adds zero, sequence_parallel and cp."""
    common = {a.name: r.get(x, a.name, wx, int, 1) for a in _FILE_AXES}
    common["order"] = r.get(x, "order", wx, str, DEFAULT_ORDER)
    if version == 1:
        return LayerStrategy(**common, recompute="full" if r.get(x, "checkpoint", wx, bool, False) else "none")
    if "checkpoint" in x:
        r.fail(f"{wx}checkpoint", "version 2 says recompute (none | selective | full) instead")
    refined = dict(recompute=r.get(x, "recompute", wx, str, "none"), zero=r.get(x, ZERO.field, wx, int, 0),
                   sequence_parallel=r.get(x, SEQUENCE.field, wx, bool, False))
    return LayerStrategy(**common, **refined, **{a.name: r.get(x, a.name, wx, int, 1) for a in _OPTIONAL_AXES})


def _schedule(r: _Reader, d: dict, version: int) -> dict:
    """Version 1: `schedule` is the kind. Version 2: the record {kind, virtual_stages, stage_ranks,
    actions, expert_overlap}."""
    if version == 1 or isinstance(d.get("schedule"), str):
        if version >= 2:
            r.fail("schedule", "expected the record {kind, virtual_stages, stage_ranks, actions} of version 2")
        return {"kind": r.get(d, "schedule", "", str), "virtual_stages": 1, "stage_ranks": (), "actions": (),
                "expert_overlap": False}
    rec = r.table(r.get(d, "schedule", "", dict), "schedule")
    ranks = r.get(rec, "stage_ranks", "schedule.", list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ranks):
        r.fail("schedule.stage_ranks", f"expected a list of pipeline ranks, got {ranks!r}")
    actions = r.get(rec, "actions", "schedule.", list, [])
    if not all(isinstance(a, list) and all(isinstance(v, str) for v in a) for a in actions):
        r.fail("schedule.actions", "expected one list of action names per pipeline rank")
    return {"kind": r.get(rec, "kind", "schedule.", str), "virtual_stages": r.get(rec, "virtual_stages", "schedule.", int, 1),
            "stage_ranks": tuple(ranks), "actions": tuple(tuple(a) for a in actions),
            # optional (plans/expert_overlap.py): files without it run the all-to-alls in line
            "expert_overlap": r.get(rec, "expert_overlap", "schedule.", bool, False)}


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan_to_dict(validate(plan)), indent=2) + "\n"


def plan_from_json(text: str, origin: str = "plan") -> Plan:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        # JSONDecodeError is a ValueError, and so is an integer of more than 4,300 digits; lists
        # nested ~100,000 deep exhaust the decoder's recursion
        what = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise PlanError(f"{origin}: malformed JSON: {what}") from None
    return plan_from_dict(data, origin)


def read_plan(path: str | Path) -> Plan:
    return plan_from_json(read_text(path, "plan", PlanError), str(path))  # JSON is UTF-8


def write_plan(plan: Plan, path: str | Path) -> None:
    """Validate first, then write atomically: nothing half-written is left behind."""
    atomic_write_text(path, plan_to_json(plan))
