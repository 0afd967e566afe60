"""`paraplan plan --fallbacks F` (issue 53 item 2): the comparison of every planner on the cluster and
on the cluster less 1 ... F nodes (planners/ladder.py), the rungs in one table, the whole cluster's
best plan written to --out and the ladder to --ladder (a versioned JSON file, `paraplan.ladder/1`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from paraplan.errors import ParaplanError


def ladder_path(args) -> str:
    """--ladder, or beside --out: plan.json -> plan.ladder.json."""
    if args.ladder:
        return args.ladder
    out = Path(args.out)
    return str(out.with_name(out.stem + ".ladder.json"))


def check_ladder(args) -> None:
    """Before any work: the flags that go with --fallbacks, and where the ladder goes."""
    from paraplan.cli.args import check_output

    for flag, value in (("--prove", args.prove or None), ("--try-top", args.try_top), ("--engine", args.engine)):
        if value is not None:
            raise ParaplanError(f"{flag}: not with --fallbacks yet (the ladder is a table of comparisons)")
    if args.fallbacks is None and (args.ladder or args.drop):
        raise ParaplanError(f"{'--ladder' if args.ladder else '--drop'}: only with --fallbacks")
    if args.mtbf is not None and not args.mtbf > 0:
        raise ParaplanError(f"--mtbf: hours between a node's failures, positive; got {args.mtbf}")
    if args.fallbacks is not None:
        check_output("--ladder", ladder_path(args))


def run_ladder(args, w, cluster, started: float) -> int:
    """Every rung's comparison, each with its share of the time limit; the table; the files."""
    from paraplan.costs.goodput import LLAMA3_NODE_MTBF_H
    from paraplan.planners.ladder import fallback_ladder, ladder_document
    from paraplan.plans.plan_file import plan_to_dict, write_plan
    from paraplan.system.fileio import atomic_write_text

    limit = args.time_limit or 60.0
    drop = tuple(x.strip() for x in args.drop.split(",") if x.strip()) if args.drop else ()
    from paraplan.planners.auto import compare

    rungs = fallback_ladder(w.request, cluster, args.fallbacks, compare,
                            max(limit - (time.perf_counter() - started), limit / 2), drop=drop)
    document = ladder_document(rungs, args.model, w.request.batch, plan_to_dict, args.mtbf or LLAMA3_NODE_MTBF_H)
    top = rungs[0].comparison
    if top.best is None:
        from paraplan.planners.auto import no_plan_reason

        raise ParaplanError(no_plan_reason(top, limit))
    write_plan(top.row(top.best).plan, args.out)
    atomic_write_text(ladder_path(args), json.dumps(document, indent=1))
    if args.report:  # rung 0's comparison, the rungs in a section of their own
        import sys

        from paraplan.report.html import write_report
        from paraplan.workload import model_flops_of

        path = write_report(top, rungs[0].costs, args.report, model_flops_of(w.built, w.spec), ladder=document)
        print(f"report written to {path}", file=sys.stderr if args.json else None)
    if args.json:
        print(json.dumps({**{k: v for k, v in document.items() if k != "rungs"}, "ladder": ladder_path(args),
                          "rungs": [{k: v for k, v in r.items() if k != "plan"} for r in document["rungs"]]},
                         indent=2))
        return 0
    _print_rungs(rungs, args, w, document)
    return 0


def _print_rungs(rungs, args, w, document) -> None:
    from rich.table import Table

    from paraplan.report.tables import console, human_bytes

    full = rungs[0].comparison.row(rungs[0].comparison.best)
    table = Table(title=f"{args.model} on {args.cluster}, batch {w.request.batch}: the best plan with every node "
                        f"and with {len(rungs) - 1} fewer (each rung {len(rungs[0].comparison.rows)} planners)")
    numbers = ("rung", "devices", "iteration", "samples/s", "vs all", "reads", "restart", "goodput")
    for column in ("rung", "without", "devices", "best planner", "shape", "iteration", "samples/s", "vs all", "reads",
                   "restart", "goodput"):
        table.add_column(column, justify="right" if column in numbers else "left")
    for k, rung in enumerate(rungs):
        result = rung.comparison
        best = result.row(result.best) if result.best else None
        if best is None:
            table.add_row(str(k), ", ".join(rung.dropped) or "-", str(rung.cluster.n_devices), "-",
                          "nothing fits", "-", "-", "-", "-", "-", "-")
            continue
        switch = document["rungs"][k]["switch"]  # priced once, in ladder_document
        table.add_row(str(k), ", ".join(rung.dropped) or "-", str(rung.cluster.n_devices), result.best, best.shape,
                      f"{best.iteration_s:.4g} s", f"{best.throughput:.4g}", f"{best.throughput / full.throughput:.0%}",
                      human_bytes(switch["most_read_bytes"]) if switch else "-",
                      f"{switch['restart_s']:.3g} s" if switch else "-",
                      f"{g['samples_per_s']:.4g} ({g['useful']:.1%})" if (g := document["rungs"][k]["goodput"]) else "-")
    out = console()
    out.print(table)
    if len(rungs) > 1:
        switch = document["rungs"][1]["switch"]
        storage = switch["storage"] if switch else "as the cluster file says"
        out.print("reads: the most any device of the rung reads from the last checkpoint to load its plan; restart: "
                  f"the reads at the storage's bandwidth, then one iteration (costs/restart.py; storage {storage})")
    mtbf = document["node_mtbf_h"]
    whole = document["ladder_goodput_samples_per_s"]
    out.print(f"goodput: samples/s trained usefully with a node failing every {mtbf:,.0f} h on average"
              f"{'' if args.mtbf else ' (Llama 3, section 3.3.4: 466 interruptions in 54 days on 2,048 nodes)'}, "
              "checkpoints every sqrt(2 C M_job) (costs/goodput.py)"
              + (f"; the ladder's until its last rung fails: {whole:.4g} samples/s" if whole else ""))
    out.print(f"the whole cluster's best plan: {args.out}; the ladder ({len(rungs)} rungs, paraplan.ladder/1): "
              f"{ladder_path(args)}")


def goodput_choice(result, costs, node_mtbf_h: float):
    """`plan --mtbf H` (issue 53 item 4): the feasible plan of the highest goodput (costs/goodput.py:
    its restart and its checkpoint's write, over the nodes it uses), and one line saying whether
    that changed the comparison's choice. Operator placements are left out (no checkpoints)."""
    from paraplan.costs.goodput import plan_goodput
    from paraplan.plans.kinds import PlanKind

    fastest = result.row(result.best)
    scored = [(plan_goodput(r.plan, r.throughput, r.iteration_s, costs, node_mtbf_h), r) for r in result.rows
              if r.status == "ok" and r.plan.kind is not PlanKind.OPERATORS]
    if not scored:
        return fastest, ""
    g, best = max(scored, key=lambda x: (x[0].goodput, x[1].planner == fastest.planner))
    if best.planner == fastest.planner:
        return fastest, (f"by goodput with a node failing every {node_mtbf_h:,.4g} h: {best.planner} too, "
                         f"{g.goodput:.4g} samples/s useful ({g.useful:.2%}; checkpoints every {g.interval_s:.4g} s)")
    mine = next(x for x, r in scored if r.planner == fastest.planner) if any(
        r.planner == fastest.planner for _, r in scored) else None
    theirs = f", against {mine.goodput:.4g} for {fastest.planner}" if mine else ""
    return best, (f"by goodput with a node failing every {node_mtbf_h:,.4g} h: {best.planner} ({g.goodput:.4g} "
                  f"samples/s useful, {g.useful:.2%}{theirs}) rather than the fastest, {fastest.planner}: "
                  f"written to the plan file")
