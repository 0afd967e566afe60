"""The token dispatcher of an expert-parallel plan (issue 50 item 2: group-limited routing capping the
nodes a token reaches, which only a de-duplicating dispatcher turns into fewer bytes).

  alltoall  Megatron-LM's `--moe-token-dispatcher-type alltoall`, torchtitan 0.3.0's "standard"
            backend and paraplan's runtime: every routed copy of a token is sent to its expert's
            rank (costs/expert_costs.py: dispatch_s). The default.
  deepep    DeepEP's kernels (deepseek-ai/DeepEP): megatron-core 0.16.1's flex dispatcher,
            `--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep`, and torchtitan
            0.3.0's `moe_comm_backend = "deepep"` (a model registry argument: config_registry.py's
            qwen3_moe_deepep); NeMo Automodel runs its DeepSeek-V3 and Qwen3-MoE rows with it
            ("TE + DeepEP", docs/performance-summary.md). A token crosses the network once per other
            node holding its experts (costs/deepep.py).

`expert_dispatch_problem` is when a plan may name deepep: expert parallelism somewhere, expert tensor
parallelism 1 (paraplan prices DeepEP over the EP group; megatron-core's flex dispatcher would
span ETP x EP), and bf16 (DeepEP dispatches bf16 or FP8 tokens; fp16 and fp32 it has no kernels for).
"""

from __future__ import annotations

from paraplan.precision import Precision, compute_precision

DISPATCHERS = ("alltoall", "deepep")
DEFAULT_DISPATCHER = "alltoall"


def expert_dispatch_problem(plan) -> str | None:
    """Why the plan (`Plan`) cannot run its `expert_dispatcher`, or None."""
    if plan.expert_dispatcher not in DISPATCHERS:
        return f"unknown dispatcher {plan.expert_dispatcher!r} (one of {', '.join(DISPATCHERS)})"
    if plan.expert_dispatcher == DEFAULT_DISPATCHER:
        return None
    strategies = [x for s in plan.stages for x in s.strategies]
    if not any(x.ep > 1 for x in strategies):
        return "DeepEP's dispatcher needs expert parallelism (a layer with ep > 1)"
    if any(x.etp > 1 for x in strategies):
        return "DeepEP's dispatcher is priced with expert tensor parallelism 1 (a layer has etp > 1)"
    if compute_precision(plan.precision) != Precision.BF16:  # an fp8 plan's tokens are bf16 between its linears
        return f"DeepEP dispatches bf16 (or FP8) tokens, not {plan.precision}"
    return None
