"""A plan as a DeepSpeed 0.19.8 JSON configuration (`deepspeed.initialize(config=...)`).

What maps where (deepspeed/runtime/config.py and its sections):
- `train_batch_size` (the global batch), `train_micro_batch_size_per_gpu` (per data-parallel rank)
  and `gradient_accumulation_steps` (the plan's micro-batches; the pipeline engine's micro-batch
  count): DeepSpeed asserts batch = micro x steps x data-parallel ranks;
- `zero_optimization.stage`: the plan's ZeRO stage over its replicas, 3 for sharded data
  parallelism (ZeRO-3 / FSDP); `zero_optimization.overlap_comm` false, as the prediction prices it
  (0.19.8 turns it on for ZeRO-3 by default; its overlap is not priced);
- `bf16.enabled` / `fp16.enabled`; an fp8 plan is refused: 0.19.8's config (runtime/config.py,
  runtime/constants.py) has no FP8 training setting, only bf16 and fp16; FP8 GEMMs would come from
  the model's own code (Transformer Engine's layers under its fp8_autocast), which no config sets;
- tensor parallelism as AutoTP training (`tensor_parallel.autotp_size`), which has no
  Megatron-style sequence parallelism (DeepSpeed's own sequence parallelism is Ulysses, another
  scheme): TP with SP is refused;
- pipelines: DeepSpeed's PipelineEngine runs its TrainSchedule, non-interleaved 1F1B, one stage
  per rank, and asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
  (pipe/engine.py). The stage count and the cut belong to `PipelineModule(num_stages=...,
  partition_method=...)`, not to the config (the config's `pipeline.stages` / `partition` are
  not read by the engine): they are written in the config's `pipeline` section, which DeepSpeed
  accepts, for the user's PipelineModule. The plan's cut is exported where one of DeepSpeed's
  partition methods produces it: "uniform" (`partition_uniform` over the layer count) or
  "parameters" (`partition_balanced` over each layer's parameter count), both ported here
  verbatim from deepspeed/runtime/utils.py (the tests check them against DeepSpeed's own);
  any other cut is refused, naming both;
- full recomputation: `pipeline.activation_checkpoint_interval` 1 with a pipeline, and the
  `activation_checkpointing` section (the model calls deepspeed.checkpointing.checkpoint per block);
  selective recomputation has no DeepSpeed setting and is refused.
"""

from __future__ import annotations

from paraplan.engines.layout import EngineLayout, ExportRefused
from paraplan.engines.shape import ModelShape
from paraplan.plans.plan import Recompute
from paraplan.plans.schedules import Schedule
from paraplan.precision import Precision, compute_precision

ENGINE = "deepspeed"
VERSION = "0.19.8"


def refusal(layout: EngineLayout, shape: ModelShape, params: tuple[int, ...]) -> str | None:
    if layout.precision == Precision.FP8:
        return (f"fp8 ({layout.fp8_recipe}): DeepSpeed {VERSION}'s config has no FP8 training (bf16 and fp16 only); "
                "its FP8 lives in the model's code, Transformer Engine's layers under fp8_autocast")
    if layout.cp > 1:
        return "context parallelism (DeepSpeed's sequence parallelism is Ulysses, not ring attention)"
    if layout.ep * layout.etp > 1:
        return (f"expert parallelism (EP{layout.ep} x ETP{layout.etp}): DeepSpeed's MoE lives in the model's code "
                "(deepspeed.moe.layer.MoE with its ep_size), not in its config")
    if layout.tp > 1 and layout.sequence_parallel:
        return "Megatron-style sequence parallelism with TP (DeepSpeed's AutoTP has none)"
    if layout.dp_shard > 1 and layout.dp_replicate > 1:
        return "hybrid sharding (sharded sdp ways, replicated dp ways)"
    if layout.zero and layout.dp_shard > 1:
        return f"ZeRO-{layout.zero} over the replicas of a sharded group"
    if layout.recompute == Recompute.SELECTIVE:
        return "selective recomputation (DeepSpeed checkpoints whole layers)"
    if layout.pp > 1:
        if layout.schedule != Schedule.ONE_F_ONE_B or layout.virtual > 1:
            return (f"the {layout.schedule} schedule (DeepSpeed's pipeline engine runs non-interleaved 1F1B only; "
                    "0.19.8's DualPipeVEngine takes a DualPipeVModule, which its config does not set)")
        if layout.actions:
            return "a per-rank order of actions of the plan's own (DeepSpeed runs its own 1F1B order)"
        if layout.zero >= 2 or layout.dp_shard > 1:
            stage = 3 if layout.dp_shard > 1 else layout.zero
            return f"ZeRO-{stage} with pipeline parallelism (DeepSpeed's pipeline engine takes ZeRO-1 at most)"
        if layout.tp > 1:
            return "AutoTP tensor parallelism inside DeepSpeed's pipeline engine"
        if partition_method(layout, params) is None:
            cut = _starts(layout)
            return (f"the cut at layers {cut[1:-1]} (DeepSpeed's partition methods give uniform "
                    f"{partition_uniform(len(params), layout.pp)[1:-1]}, parameters "
                    f"{partition_balanced(list(params), layout.pp)[1:-1]})")
    return None


def config(layout: EngineLayout, shape: ModelShape, params: tuple[int, ...]) -> tuple[dict, list[str]]:
    """(the DeepSpeed config, notes); `params`: each layer's parameter count, in order."""
    problem = refusal(layout, shape, params)
    if problem:
        raise ExportRefused(ENGINE, problem)
    notes = list(layout.notes)
    out: dict = {"train_batch_size": layout.global_batch, "train_micro_batch_size_per_gpu": layout.micro_batch,
                 "gradient_accumulation_steps": layout.n_micro,
                 # overlap_comm off, as the prediction prices it (costs/engine_profile.py: DeepSpeed's
                 # gradient-reduction and ZeRO-3 gather overlap are not priced; 0.19.8 turns it on for
                 # ZeRO-3 by default): said, so the run is the one predicted
                 "zero_optimization": {"stage": 3 if layout.dp_shard > 1 else layout.zero, "overlap_comm": False}}
    compute = compute_precision(layout.precision)  # fp8 never gets here (refusal); bf16 but for its linears
    if compute in (Precision.BF16, Precision.FP16):
        out[compute.value] = {"enabled": True}
    if layout.tp > 1:
        out["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.recompute == Recompute.FULL:
        out["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
        notes.append("full recomputation: the pipeline engine checkpoints every layer spec with parameters "
                     "(activation_checkpoint_interval 1: the embedding and head too, more than the plan recomputes)"
                     if layout.pp > 1 else
                     "full recomputation: the model calls deepspeed.checkpointing.checkpoint around each block")
    if layout.pp > 1:
        out["pipeline"] = {"stages": layout.pp, "partition": partition_method(layout, params),
                           "activation_checkpoint_interval": 1 if layout.recompute == Recompute.FULL else 0}
        notes.append(f"pipeline: PipelineModule(layers, num_stages={layout.pp}, partition_method="
                     f"\"{out['pipeline']['partition']}\"), one layer spec per paraplan layer ({len(params)})")
    return out, notes


def _starts(layout: EngineLayout) -> list[int]:
    return [layers[0] for layers in layout.layers_per_stage] + [layout.layers_per_stage[-1][-1] + 1]


def partition_method(layout: EngineLayout, params: tuple[int, ...]) -> str | None:
    """The DeepSpeed partition method that gives the plan's cut, or None."""
    cut = _starts(layout)
    if partition_uniform(len(params), layout.pp) == cut:
        return "uniform"
    if partition_balanced(list(params), layout.pp) == cut:
        return "parameters"
    return None


# Ported from deepspeed/runtime/utils.py (0.19.8) so that export does not import DeepSpeed; the
# tests compare both with DeepSpeed's own on random inputs.
def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    parts = [0] * (num_parts + 1)
    if num_items <= num_parts:  # one item per part, the last parts empty
        for p in range(num_parts + 1):
            parts[p] = min(p, num_items)
        return parts
    chunksize = num_items // num_parts
    residual = num_items - (chunksize * num_parts)
    for p in range(num_parts):  # the first `residual` parts get one more
        parts[p + 1] = parts[p] + chunksize + (1 if p < residual else 0)
    return parts


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """Contiguous parts minimising (largest part - smallest part), DeepSpeed's dynamic programme with
    its tie rule (the later split point on ties)."""
    import numpy as np

    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    dp_max = np.full((n + 1, num_parts + 1), np.inf)
    dp_min = np.full((n + 1, num_parts + 1), np.inf)
    dp_cost = np.full((n + 1, num_parts + 1), np.inf)
    position = np.zeros((n + 1, num_parts + 1), dtype=int)
    prefix_sum = np.zeros(n + 1)
    prefix_sum[1:] = np.cumsum(weights)
    dp_max[0, 0] = 0
    dp_cost[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, num_parts) + 1):
            for k in range(i):
                max_sum = max(dp_max[k, j - 1], prefix_sum[i] - prefix_sum[k])
                min_sum = min(dp_min[k, j - 1], prefix_sum[i] - prefix_sum[k])
                cost = max_sum - min_sum
                if dp_cost[i, j] >= cost:
                    dp_cost[i, j] = cost
                    dp_max[i, j] = max_sum
                    dp_min[i, j] = min_sum
                    position[i, j] = k
    parts = [n]
    for j in reversed(range(1, num_parts + 1)):
        parts.append(int(position[parts[-1], j]))
    return parts[::-1]
