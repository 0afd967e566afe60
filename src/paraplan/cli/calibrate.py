"""`paraplan calibrate`: this machine measured once (profiling/calibrate/) into a cluster file for plan,
simulate and train --compare."""

from __future__ import annotations

import json
import os
from pathlib import Path

from paraplan.cli.args import check_output


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine once (compute, links under load, runtime "
                                         "overheads) and write a cluster file for plan, simulate and train --compare")
    p.add_argument("--out", default="local-calibrated.toml", help="write the calibrated cluster file here (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="two reference models and three overhead runs (~40 s here)")
    p.add_argument("--devices", type=int, default=None,
                   help="devices (CPU cores, one process each) in the written cluster (default: every core)")
    p.add_argument("--json", action="store_true", help="print JSON (schema paraplan.calibrate/1) instead of lines")
    p.set_defaults(func=run)


def run(args) -> int:
    from paraplan.cli.plan_runs import BUSY_LOAD, load_average
    from paraplan.hardware.cluster_write import write_cluster_file
    from paraplan.profiling.calibrate import calibrate
    from paraplan.report.tables import console

    check_output("--out", args.out)
    load = load_average()  # what else ran beside the measurement (the proof says the same of its runs)
    with console(stderr=True).status("calibrating") as status:
        result = calibrate(quick=args.quick, devices=args.devices, progress=lambda text: status.update(f"calibrating: {text}"))
    result.evidence["load_average_at_start"] = load
    write_cluster_file(result.cluster, args.out, calibration=result.evidence)
    cached = None
    if args.devices is None or args.devices == (os.cpu_count() or 1):  # this whole machine: `local` from now on
        from paraplan.profiling.calibration_cache import store

        cached = store(Path(args.out))
    if args.json:
        from paraplan.hardware.cluster_write import cluster_to_dict

        print(json.dumps({"schema": "paraplan.calibrate/1", "out": args.out,
                          "cluster": cluster_to_dict(result.cluster, result.evidence)}, indent=1))
        return 0
    for line in result.summary:
        console().print(line)
    cores = os.cpu_count() or 1
    console().print(f"load average {load:.2f} on {cores} cores at the start" + (
        f": above {BUSY_LOAD}, these figures measure the other work too; calibrate again on a quiet machine"
        if load > BUSY_LOAD else ""))
    console().print(f"cluster written to {args.out}: use it as --cluster {args.out} with plan, simulate and "
                    "train --compare" + (f"; `--cluster local` uses it too (cached in {cached})" if cached else ""))
    return 0
