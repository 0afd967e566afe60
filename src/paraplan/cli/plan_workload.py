"""What `paraplan plan` plans for, from its flags, for one planner and for the comparison alike: the
model measured on the cluster (`local`: this machine's cached calibration), its costs and its
request (paraplan/workload.py), and the line that says which input size the plan is for."""

from __future__ import annotations


def plan_workload(args, cluster, *, batch, operators: str | None, watch, options=None):
    """The request of the flags: the model measured on the cluster, its costs, its limits. `local`
    is this machine's cached calibration (cli/machine.py) unless --no-calibration or --profile."""
    from paraplan.cli.machine import machine_cluster
    from paraplan.hardware import load_cluster
    from paraplan.workload import workload

    if isinstance(cluster, str) or getattr(cluster, "name", None) == "local":
        def check_model() -> None:  # the model refused (an MoE, a failing build) before this machine is measured
            from paraplan.workload import built_model

            built_model(args.model, seq_len=args.seq_len, image_size=args.image_size, layers=args.layers)

        measured = machine_cluster(args.cluster, args.precision, skip=args.no_calibration or bool(args.profile),
                                   check=check_model)
        if measured != args.cluster:
            cluster = load_cluster(measured)

    return workload(args.model, cluster, cluster_name=args.cluster, batch=batch, profile=args.profile,
                    memory=_memory(args), seq_len=args.seq_len,
                    image_size=args.image_size, layers=args.layers, operators=operators, stages=args.stages,
                    micro_batches=args.micro_batches, schedule=args.schedule, exact_stages=args.exact_stages,
                    options=options, watch=watch, precision=args.precision, fp8_recipe=getattr(args, "fp8_recipe", None),
                    fp8_param_gather=getattr(args, "fp8_param_gather", False),
                    engine=getattr(args, "engine", None) or "paraplan", headroom=getattr(args, "headroom", None))


def print_input(args, built) -> None:
    """The input size the plan is for and where it came from (`paraplan plan --model llama2-7b` plans
    at CSIMD's 32 tokens unless told otherwise: issue 46), on the console the table went to."""
    from paraplan.report.tables import console

    console(stderr=args.json).print(f"input: {input_note(args, built)}")


def input_note(args, built) -> str:
    """"seq 32 (the zoo's setting for llama2-7b: ...; --seq-len N to change)": the line above, and
    --json's `input_note`."""
    from paraplan.workload import size_note

    return size_note(built, seq_len=args.seq_len, image_size=args.image_size)


def _memory(args):
    """The request's budget: one per device type (--memory a100=36GiB,...), one for all, or none."""
    from paraplan.sizes import gib_bytes

    kinds = getattr(args, "memory_kinds", None)
    if kinds:
        return dict(kinds)
    return None if args.memory_gib is None else gib_bytes(args.memory_gib)
