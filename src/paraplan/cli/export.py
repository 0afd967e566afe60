"""`paraplan export PLAN --to torchtitan|megatron|deepspeed`: a plan as the engine's own
configuration (paraplan/engines/), or one line naming what the engine cannot run (exit 2)."""

from __future__ import annotations

from pathlib import Path

from paraplan.cli.args import check_output


def add_parser(sub) -> None:
    from paraplan.engines import ENGINES

    p = sub.add_parser("export", help="write a plan as torchtitan's overrides, Megatron-LM's arguments or a DeepSpeed "
                                      "config")
    p.add_argument("plan", help="plan JSON file (paraplan plan)")
    p.add_argument("--to", required=True, metavar="ENGINE",
                   help=f"the engine: {', '.join(ENGINES)} (docs/engines.md: what each takes and refuses)")
    p.add_argument("--out", default=None,
                   help="write the file here (torchtitan: one argument per line; Megatron-LM: its arguments and "
                        "TransformerConfig as JSON; DeepSpeed: the config JSON); default: print it")
    p.set_defaults(func=run)


def run(args) -> int:
    from paraplan.engines import check_engine, export
    from paraplan.errors import ParaplanError
    from paraplan.hardware import launch_placement
    from paraplan.plans.plan_file import read_plan
    from paraplan.system.fileio import atomic_write_text

    engine = check_engine(args.to)
    csv_path = None
    if args.out:
        check_output("--out", args.out)
        csv_path = str(Path(args.out).with_suffix(".schedule.csv"))
        check_output("--out", csv_path)
    plan = read_plan(args.plan)
    result = export(plan, engine, schedule_csv_path=csv_path or "schedule.csv",
                    placement=launch_placement(plan.cluster, plan.devices))
    if result.schedule_csv and not args.out:
        raise ParaplanError("this plan's order of actions goes to torchtitan in a CSV file beside the arguments: "
                            "give --out")
    if not args.out:
        print(result.text, end="")
        return 0
    if result.schedule_csv:  # the CSV first: the arguments name it
        atomic_write_text(csv_path, result.schedule_csv)
    atomic_write_text(args.out, result.text)
    print(f"wrote {args.out}" + (f" and {csv_path} (the order of actions)" if result.schedule_csv else ""))
    for note in result.notes:
        print(f"note: {note}")
    print(f"run: {result.command}")
    print(_engine_prediction(plan, engine))
    return 0


def _engine_prediction(plan, engine: str) -> str:
    """The plan priced as `engine` runs it (costs/engine_profile.py), beside its launch: one line.
    `local` is this machine's cached calibration when there is one (none is measured for this)."""
    from paraplan.cli.machine import machine_cluster
    from paraplan.engines.layout import ENGINE_NAMES
    from paraplan.errors import ParaplanError
    from paraplan.hardware import load_cluster
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import precision_of, workload

    try:
        cluster = load_cluster(machine_cluster(plan.cluster, plan.precision, make=False) or plan.cluster)
        w = workload(plan.model, cluster, engine=engine, **precision_of(plan))
        p = simulate_plan(plan, w.costs).prediction
    except ParaplanError as exc:  # the file is written: a plan that cannot be priced here says why
        return f"no prediction as {ENGINE_NAMES[engine]} runs it: {exc}"
    peak = max((m.peak_bytes for m in p.memory), default=0) / 2**30
    from paraplan.costs.model_flops import plan_achieved
    from paraplan.report.tables import achieved_text
    from paraplan.workload import model_flops_of

    flops = model_flops_of(w.built, w.spec)
    per_gpu = plan_achieved(flops, plan, cluster, p.throughput_samples_per_s)
    return (f"predicted as {ENGINE_NAMES[engine]} runs it: {_seconds(p.iteration_s)} per iteration, {peak:.1f} GiB on "
            f"the fullest device{'' if p.feasible else ' (' + p.reason + ')'}"
            + (f"; {achieved_text(per_gpu, flops)}" if per_gpu is not None else "")
            + f" (paraplan simulate PLAN --engine {engine}: the details)")


def restricted(result, engine: str, w):
    """`plan --engine`: the comparison of workload `w` restricted to what `engine` runs
    (engines/restrict.py), projections judged on the request's costs."""
    from paraplan.engines.restrict import restrict_workload

    return restrict_workload(result, engine, w)


def _seconds(s: float) -> str:
    """As the comparison's lines say a time (report/tables.py: human_seconds): never an exponent."""
    return f"{s:.3f} s" if s >= 1 else f"{s * 1e3:.3f} ms"


def engine_line(result, best) -> str:
    """--engine: the best plan the engine can run against the best of all, and how to export it."""
    from paraplan.engines.layout import ENGINE_NAMES
    from paraplan.engines.recipes import recipes_name

    name, top = ENGINE_NAMES[result.engine], result.unrestricted
    if best is None:
        recipes = next((r for r in result.rows if r.planner == recipes_name(result.engine)), None)
        return f"{name} can run none of the plans that fit" + (
            f"; the best of all, {top.planner}: {_seconds(top.iteration_s)}" if top else "") + (
            f"; its own recipes: {recipes.shape + ': ' if recipes.shape else ''}{recipes.reason}" if recipes else "")
    text = f"{name}: the best plan it can run is {best.planner}'s"
    if top is not None and top.planner != best.planner and best.iteration_s <= top.iteration_s:
        text += (f", faster than every planner's own ({top.planner}'s, {_seconds(top.iteration_s)}, "
                 f"{top.iteration_s / best.iteration_s - 1:+.1%})")
    elif top is not None and top.planner != best.planner:
        refused = next(r for r in result.rows if r.planner == top.planner)
        text += (f", {best.iteration_s / top.iteration_s - 1:.1%} slower than the best of all ({top.planner}'s, "
                 f"{_seconds(top.iteration_s)}: {refused.reason})")
    else:
        text += " (the best of all too)"
    return text + f"; export it with `paraplan export PLAN --to {result.engine}`"


def engines_line(result, best, shape) -> str:
    """Without --engine: which engines run the chosen plan, and for each that does not, the best
    row of the comparison it does run (by paraplan's own prediction; `--engine E` searches E's
    recipes and prices as E runs them)."""
    from paraplan.engines import ENGINES, engine_problem
    from paraplan.engines.layout import ENGINE_NAMES

    if best is None:
        return ""
    runs = [ENGINE_NAMES[e] for e in ENGINES if engine_problem(best.plan, e, shape) is None]
    others = []
    for engine in ENGINES:
        if ENGINE_NAMES[engine] in runs:
            continue
        rows = sorted((r for r in result.rows if r.status == "ok" and engine_problem(r.plan, engine, shape) is None),
                      key=lambda r: r.iteration_s)
        others.append(f"{ENGINE_NAMES[engine]}'s best here is {rows[0].planner}'s, "
                      f"{rows[0].iteration_s / best.iteration_s - 1:+.1%}" if rows else
                      f"{ENGINE_NAMES[engine]} runs none of these")
    # DeepSpeed takes any model: its refusal names what of the plan itself no engine runs
    head = (f"engines: {', '.join(runs)} run{'s' if len(runs) == 1 else ''} the chosen plan" if runs
            else f"engines: none runs the chosen plan (DeepSpeed: {engine_problem(best.plan, 'deepspeed', shape)})")
    tail = "; ".join(others)
    return head + (f"; {tail}" if tail else "") + (
        "; `--engine NAME` searches that engine's own recipes, priced as it runs them" if others or not runs else
        "; `paraplan export PLAN --to NAME` writes its configuration")
