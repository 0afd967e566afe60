"""Megatron-LM's expert-parallel all-to-all overlap as a plan choice (issue 50 item 2: "the
all-to-all's overlap with compute where the engine overlaps it").

megatron-core 0.16.1's `--overlap-moe-expert-parallel-comm` (`overlap_moe_expert_parallel_comm`)
runs the steady state of the 1F1B schedule as combined passes: the forward of one micro-batch and
the backward of another go through each transformer layer together, so that one's dispatch and
combine all-to-alls run while the other computes (megatron/core/pipeline_parallel/
combined_1f1b.py; Megatron-MoE-ModelZoo turns it on per run, `A2A_OVERLAP=1`, and leaves it off in
others). `TransformerConfig.__post_init__` (transformer_config.py, 0.16.1) allows it only with
expert parallelism, the alltoall or flex dispatcher (paraplan's export writes alltoall), bf16 or
fp16, no full recomputation, and, with more than one pipeline rank, a virtual pipeline
(interleaving). `expert_overlap_problem` is that rule on a plan; the simulator prices the overlap
(simulator/plan_work.py), the Megatron-LM export writes the flag, and the other engines and
paraplan's own runtime refuse it in one line.

Memory is priced as without it: a combined pass runs one micro-batch's forward through the layers
in order while the other's backward runs through them in reverse, so the forward stores a layer's
activations as the backward frees another's, and about one micro-batch's stay live, as in 1F1B.
"""

from __future__ import annotations

from paraplan.plans.schedules import Schedule
from paraplan.precision import Precision, compute_precision

# the pipeline schedules whose steady state Megatron-LM runs as combined passes (one pipeline rank,
# whatever its label: Megatron's no-pipelining schedule, gradient accumulation, combines them too)
OVERLAP_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)


def expert_overlap_problem(plan) -> str | None:
    """Why Megatron-LM would refuse the all-to-all overlap on this plan (`Plan`), or None."""
    strategies = [x for s in plan.stages for x in s.strategies]
    if not any(x.ep > 1 for x in strategies):
        return "the all-to-all overlap needs expert parallelism (a layer with ep > 1)"
    if compute_precision(plan.precision) not in (Precision.BF16, Precision.FP16):  # fp8: bf16 but its linears
        return f"the all-to-all overlap runs in bf16 or fp16 (fp8 included), not {plan.precision}"
    if any(x.checkpoint for x in strategies):
        return "the all-to-all overlap cannot run with full recomputation (megatron-core asserts it)"
    if plan.n_ranks > 1 and plan.schedule not in OVERLAP_SCHEDULES:
        return f"the all-to-all overlap runs in Megatron-LM's 1F1B schedules, not {plan.schedule}"
    if plan.n_ranks > 1 and plan.virtual_stages == 1:
        return "the all-to-all overlap with a pipeline needs interleaving (megatron-core asserts a virtual pipeline)"
    return None


def steady_share(n_micro: int, ranks: int, virtual: int, rank: int) -> float:
    """The share of a pipeline rank's passes that run combined with a pass of another micro-batch:
    those of 1F1B's steady state. Megatron's interleaved schedule runs (p - r - 1) x 2 + (v - 1) x p
    warm-up forwards on rank r of p (schedules.py: get_pp_rank_microbatches), capped at its n x v
    forwards; 1F1B without interleaving p - r - 1, and one rank 1 (the first forward has no backward
    beside it). Each warm-up forward and its cool-down backward run alone."""
    total = n_micro * virtual
    if ranks == 1:
        warmup = 1
    elif virtual > 1:
        warmup = (ranks - rank - 1) * 2 + (virtual - 1) * ranks
    else:
        warmup = ranks - rank - 1
    return max(0, total - min(max(warmup, 1), total)) / total
