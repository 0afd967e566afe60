"""The Python API: what `paraplan plan / simulate / train` do, callable from scripts.

    import paraplan

    best = paraplan.plan("gpt2-xl", "galvatron-8xtitan", batch=64, memory="16GiB")   # every planner
    print(best.search.planner, best.prediction.iteration_s)
    sim = paraplan.simulate(best)                     # the simulator's Simulation (timeline, memory)
    one = paraplan.plan("vgg-16", "csimd-v100-1gbe", batch=64, planner="csimd", stages=4)
    table = paraplan.compare("lenet-5", "local", batch=16)   # every planner's row and the lower bound
    best_tt = paraplan.plan("llama2-7b", "dgx-a100-80gb", batch=64, engine="torchtitan")  # one torchtitan runs
    paraplan.export(best_tt, to="torchtitan", out="llama.args")   # its overrides (paraplan export)
    result = paraplan.train(paraplan.load_plan("plan.json"), steps=3)   # real processes (gloo)

Errors are ParaplanError (FieldError names the argument), as the command line's one-line messages.
The command line builds the same requests with the same functions (workload.py: the model measured,
its cost model and request; planners/registry, auto.compare, simulator/predict, runtime/launcher/launch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import Path

from paraplan.errors import FieldError, ParaplanError
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan


def load_plan(path: str | Path) -> Plan:
    from paraplan.plans.plan_file import read_plan

    if not isinstance(path, (str, os.PathLike)):
        raise ApiArgumentError(f"load_plan: expected the path of a plan file, got {type(path).__name__}")
    return read_plan(path)


class ApiArgumentError(ParaplanError, TypeError):
    """A call the API cannot take (an unknown keyword, a value of the wrong kind): a ParaplanError,
    as the command line's one-line refusals are, and a TypeError, as Python's own would be."""


def _plan_of(plan_or_path, what: str) -> Plan:
    if isinstance(plan_or_path, Plan):
        return plan_or_path
    if isinstance(plan_or_path, (str, os.PathLike)):
        return load_plan(plan_or_path)
    raise ApiArgumentError(f"{what}: expected a Plan or the path of a plan file, got {type(plan_or_path).__name__}")


# the keywords every request takes (compare's and plan's **kw), as `_workload` names them
REQUEST_KEYWORDS = ("memory", "stages", "micro_batches", "schedule", "profile", "seq_len", "image_size",
                    "exact_stages", "options", "precision", "calibrate", "headroom", "fp8_recipe", "fp8_param_gather")


def _check_request_keywords(kw: dict, what: str) -> None:
    import difflib

    for key in kw:
        if key not in REQUEST_KEYWORDS:
            close = difflib.get_close_matches(key, REQUEST_KEYWORDS, n=1)
            raise ApiArgumentError(f"{what}() got an unexpected keyword {key!r}"
                                   + (f"; did you mean {close[0]!r}?" if close else
                                      f" (it takes {', '.join(REQUEST_KEYWORDS)})"))
    options = kw.get("options")
    if isinstance(options, Mapping):
        kw["options"] = dict(options)
    elif options is not None:
        raise FieldError("options", f"expected a dict of planner options, got {type(options).__name__}")


def _check_names(model, cluster) -> None:
    """The request's names: a model reference and a cluster as text (a path too)."""
    if not isinstance(model, (str, os.PathLike)):
        raise ApiArgumentError(f"model: expected a model reference such as 'gpt2-xl', got {type(model).__name__}")
    if not isinstance(cluster, (str, os.PathLike)):
        raise ApiArgumentError(f"cluster: expected a preset name or a cluster file, got {type(cluster).__name__}")


def _whole(name: str, value, least: int = 0) -> None:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < least:  # numpy's integers too
        raise FieldError(name, f"must be a whole number of at least {least}, got {value!r}")


def _check_time_limit(time_limit) -> None:
    if isinstance(time_limit, bool) or not isinstance(time_limit, Real) or not time_limit > 0:
        raise FieldError("time_limit", f"must be a positive number of seconds, got {time_limit!r}")


def _limit_to_this_machine() -> None:
    """The simulator refuses task graphs beyond the memory this machine has free (simulator/limits.py)."""
    from paraplan.simulator.limits import set_memory_source
    from paraplan.system.host import available_memory_bytes

    set_memory_source(available_memory_bytes)


def _workload(model: str, cluster: str, batch: int, *, operators: bool, memory=None, stages=None,
              micro_batches=None, schedule=None, profile=None, seq_len=None, image_size=None, exact_stages=False,
              options=None, precision=None, calibrate: bool = False, headroom=None, engine: str = "paraplan",
              fp8_recipe=None, fp8_param_gather: bool = False):
    """The Workload of the keywords (paraplan/workload.py, as the command line builds it); the
    operator graph, where asked, only where the model can be traced. calibrate=True: on `local`,
    measure this machine now if it has no cached calibration. `headroom`: the share of memory left
    unplanned (None: planners/request.py DEFAULT_HEADROOM without a memory budget); `engine`: whose
    implementation prices the plans."""
    from paraplan.profiling.calibration_cache import local_cluster
    from paraplan.workload import workload

    _limit_to_this_machine()
    # `local`: this machine's cached calibration where one exists (measured now only when
    # `calibrate`; issue 33), else the analytic preset: the prediction names which (cost_source)
    return workload(model, local_cluster(cluster, precision, skip=bool(profile), make=calibrate), cluster_name=cluster, batch=batch, profile=profile, memory=memory, seq_len=seq_len,
                    image_size=image_size, operators="optional" if operators else None, stages=stages,
                    micro_batches=micro_batches, schedule=schedule, exact_stages=exact_stages,
                    options=options, precision=precision, headroom=headroom, engine=engine, fp8_recipe=fp8_recipe,
                    fp8_param_gather=fp8_param_gather)


def _request(model: str, cluster: str, batch: int, **kw):
    return _workload(model, cluster, batch, **kw).request


def compare(model: str, cluster: str, batch: int, *, time_limit: float = 60.0, planners=None, engine: str | None = None,
            **kw):
    """Every applicable planner on one request (paraplan/planners/auto.py Comparison: rows, best, bound).
    engine="torchtitan" | "megatron" | "deepspeed": only the plans that engine can run count (the
    others "refused", with projections of them it can run; `paraplan plan --engine`)."""
    from paraplan.planners.auto import compare as run

    _check_request_keywords(kw, "compare")
    _check_names(model, cluster)
    _check_time_limit(time_limit)
    if isinstance(planners, str):  # one planner's name, as `planners="csimd"` reads
        planners = [planners]
    if engine is not None:
        from paraplan.engines import check_engine

        check_engine(engine)
    w = _workload(model, cluster, batch, operators=True, engine=engine or "paraplan", **kw)
    result = run(w.request, planners=planners, time_limit_s=time_limit)
    if engine is None:
        return result
    from paraplan.engines.restrict import restrict_workload

    return restrict_workload(result, engine, w)


def export(plan_or_path: Plan | str | Path, to: str, out: str | Path | None = None):
    """The plan as engine `to`'s configuration (paraplan/engines: Exported.text, .notes, .command);
    with `out`, also written there (`paraplan export PLAN --to ENGINE --out FILE`). Raises
    ParaplanError (ExportRefused) naming what the engine cannot run."""
    from paraplan.engines import export as run
    from paraplan.hardware import launch_placement
    from paraplan.system.fileio import atomic_write_text

    plan = _plan_of(plan_or_path, "export")
    if not isinstance(to, str):
        raise ApiArgumentError(f"export: to= names an engine (torchtitan, megatron, deepspeed), got {to!r}")
    csv_path = str(Path(out).with_suffix(".schedule.csv")) if out is not None else "schedule.csv"
    result = run(plan, to, schedule_csv_path=csv_path, placement=launch_placement(plan.cluster, plan.devices))
    if out is not None:
        if result.schedule_csv:
            atomic_write_text(csv_path, result.schedule_csv)
        atomic_write_text(out, result.text)
    return result


def plan(model: str, cluster: str, batch: int, *, planner: str = "auto", time_limit: float = 60.0,
         try_top: int = 0, rounds: int = 3, steps: int = 12, engine: str | None = None, **kw) -> Plan:
    """The best plan (planner="auto": every planner compared) or one planner's, with the
    simulator's prediction (its cost_source: on `local`, this machine's cached calibration where one
    exists, measured now with calibrate=True, else the analytic preset); raises ParaplanError when
    nothing fits. precision="bf16" (fp32, tf32,
    bf16, fp16; default: the cluster's default_precision) and the other keywords of compare().
    try_top=K (auto, on this machine: cluster "local" or a calibrated file of it): the K best
    predicted distinct plans run for real, `rounds` interleaved rounds of `steps` steps, and the
    measured best returned (`paraplan plan --try-top K`)."""
    _check_request_keywords(kw, "plan")
    _check_names(model, cluster)
    if not isinstance(planner, str):
        raise ApiArgumentError(f"planner: expected a planner's name or 'auto', got {type(planner).__name__}")
    _check_time_limit(time_limit)
    try_top = try_top or 0  # None: off, as 0
    _whole("try_top", try_top)
    _whole("rounds", rounds, 1)
    _whole("steps", steps, 1)
    if planner == "auto":
        if try_top:
            from paraplan.hardware import load_cluster
            from paraplan.runtime.launcher.prove import check_this_machine

            if try_top < 2:
                raise ParaplanError(f"try_top: at least 2 plans to try, got {try_top}")
            check_this_machine(load_cluster(cluster), cluster, "try_top")
        result = compare(model, cluster, batch, time_limit=time_limit, engine=engine, **kw)
        if result.best is None:
            from paraplan.planners.auto import no_plan_reason

            raise ParaplanError(no_plan_reason(result, time_limit))
        if try_top:
            return _measured_best(result, try_top, rounds, steps)
        return result.row(result.best).plan
    if try_top or engine:
        raise ParaplanError(f"{'try_top' if try_top else 'engine'}: only with planner='auto' (the comparison of "
                            "every planner)")
    from paraplan.planners.registry import make_plan
    from paraplan.planners.registry import planner as spec_of
    from paraplan.simulator.predict import simulate_plan

    request = _request(model, cluster, batch, operators=spec_of(planner).needs_operators, **kw)
    sim = simulate_plan(make_plan(request, planner), request.costs)
    if not sim.prediction.feasible:
        raise ParaplanError(f"{planner} found no plan that fits: its best {sim.prediction.reason}")
    return sim.plan


def _measured_best(result, k: int, rounds: int, steps: int) -> Plan:
    from paraplan.runtime.launcher.prove import measured_best

    rows = result.distinct(k)
    if len(rows) < 2:
        return rows[0].plan
    by_name = {f"{i + 1}. {r.planner}": r for i, r in enumerate(rows)}
    chosen, _ = measured_best({n: (r.plan, r.iteration_s) for n, r in by_name.items()}, rounds, steps)
    return by_name[chosen].plan


def simulate(plan_or_path: Plan | str | Path, *, cluster: str | None = None, profile=None, calibrate: bool = False):
    """The simulator's Simulation of a plan (its prediction, timeline, per-device memory; the
    prediction's cost_source says what it stands on: on `local`, this machine's cached calibration
    where one exists, measured now with calibrate=True)."""
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import precision_of

    p = _plan_of(plan_or_path, "simulate")
    request = _request(p.model, cluster or p.cluster, p.global_batch, operators=p.kind is PlanKind.OPERATORS, profile=profile,
                       calibrate=calibrate, **precision_of(p))
    return simulate_plan(p, request.costs)


def train(plan_or_path: Plan | str | Path, *, steps: int = 3, nproc: int | None = None, out_dir=None, **config):
    """Run the plan for real on local gloo processes (one per device); returns {"losses", "step_s",
    "out_dir"}. `config`: TrainConfig's fields (optimizer, lr, clip_norm, dropout, seed, data,
    data_dtype, ...); data="train.bin" or "samples.npz" trains on real data (docs/runtime.md)."""
    import dataclasses
    import json

    from paraplan.runtime.config import TrainConfig
    from paraplan.runtime.launcher.launch import launch_checked
    from paraplan.runtime.measure.compare import step_times

    p = _plan_of(plan_or_path, "train")
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"plan", "steps", "out_dir"}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ApiArgumentError(f"train() got an unexpected keyword {unknown[0]!r} (it takes steps, nproc, out_dir "
                               f"and TrainConfig's {', '.join(sorted(fields))})")
    cfg = TrainConfig(plan=p, model=config.pop("model", p.model), steps=steps,
                      out_dir=None if out_dir is None else str(out_dir), **config)
    out = launch_checked(cfg, nproc)  # a temporary directory when none is given
    return {"losses": json.loads((out / "losses.json").read_text()), "step_s": step_times(out), "out_dir": str(out)}
