"""`paraplan train --checkpoint-every auto` (issue 53 item 4): Young's checkpoint interval in steps."""

from __future__ import annotations

from paraplan.errors import ParaplanError


def every_arg(text: str):
    """--checkpoint-every: a whole number of steps, or auto."""
    import argparse

    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of steps or auto, got {text!r}") from None


def auto_interval(args, config, plan, spec):
    """--checkpoint-every auto: Young's interval (costs/goodput.py) in steps of the plan's predicted
    iteration, on the nodes the plan uses (its cluster's storage and ports; one node at the shared
    storage's default where the plan's cluster cannot be loaded, as a ladder rung's)."""
    from dataclasses import replace

    from paraplan.costs.goodput import LLAMA3_NODE_MTBF_H, plan_checkpoint_s, young_interval
    from paraplan.hardware import load_cluster

    if not args.checkpoint_dir:
        raise ParaplanError("--checkpoint-every auto: needs --checkpoint-dir")
    if plan.prediction is None or not plan.prediction.iteration_s > 0:
        raise ParaplanError("--checkpoint-every auto: the plan holds no predicted iteration (paraplan simulate "
                            "writes one)")
    try:
        cluster = load_cluster(args.cluster or plan.cluster)
        cluster.devices[max(plan.devices)]  # the plan's devices are the cluster's
    except (ParaplanError, IndexError):
        cluster = None
    write, nodes = plan_checkpoint_s(plan.devices, cluster, sum(layer.param_count for layer in spec.layers))
    tau = young_interval(write, LLAMA3_NODE_MTBF_H * 3600.0 / nodes)
    every = max(1, round(tau / plan.prediction.iteration_s))
    if not args.json:
        print(f"checkpoints every {every} steps: Young's interval {tau:.4g} s (a checkpoint written in {write:.3g} s, "
              f"a node failing every {LLAMA3_NODE_MTBF_H:,.0f} h over {nodes} node(s)) over the "
              f"predicted {plan.prediction.iteration_s:.4g} s an iteration")
    return replace(config, checkpoint_every=every)
