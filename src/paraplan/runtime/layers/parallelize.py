"""Galvatron-BMW plans for real: each layer of a pipeline stage runs under its own strategy.

A stage with per-layer strategies runs on its whole device group G for every micro-batch (unlike
the pipeline x data-parallel path, where each device of a stage is an independent pipeline replica).
Device at position j of stage s talks to position j of the neighbouring stages (pipeline group j).

Layout: one definition, shared with the simulator (`costs/strategy.py`): `LayerStrategy.order`
lists the dimensions inner-most first; the inner-most dimension's groups are consecutive devices
of the stage (`strategy_groups`), and the device at position j processes the micro-batch slice
`data_rank(strategy, j)` of `data_degree` slices. The device meshes are built once per rank from
the axis table (layers/meshes.py: `Meshes`), one per distinct layout.

Each layer is materialised (still on meta until then) and parallelised at once, one apply step
per axis in torchtitan's order (its models/llama3/parallelize.py): context parallelism, tensor
(and sequence) parallelism, expert parallelism (layers/expert_parallel.py: `apply_ep`), activation
recomputation, then FSDP2 last; the replicated layers' dp
groups (plain DP, ZeRO-1/2) after the stage. `parallelize_stage` composes them; a rank holds at
most one layer whole (or one unit of layers sharing a parameter) before it is split or sharded,
never the stage. Per layer (Galvatron-BMW §III), with the field's tools:
  SDP    FSDP2 `fully_shard` over the sdp dimension (dp x sdp: HSDP, the 2-D mesh (dp, sdp));
  CP     not run (`apply_cp`: torch's context_parallel shards only CUDA's fused attention); the
         plan is refused before, as a plan feature (runtime/kinds.py);
  TP     DTensor `parallelize_module` (layers/tensor_parallel.py), before FSDP2 when both (`apply_tp`);
  SP     with `sequence_parallel`, Megatron's SP (layers/sequence_parallel.py): TP's plan rewritten
         for sequence shards (inside `apply_tp`, as torchtitan's SP is TP's plan); `apply_sp`: the
         norms' Partial gradients summed over tp once per step; consecutive SP layers of a stage
         pass sequence-sharded DTensors, `StrategyLayer` cuts and gathers them at the ends of such
         a run (`sequence_ends`);
  CKPT   `torch.utils.checkpoint` (non-reentrant) around the layer (`apply_recompute`; FSDP2
         re-gathers inside the recomputation, as its hooks run again); selective recomputation
         checkpoints only the attention core (layers/selective.py);
  SDP    (`apply_fsdp`, above);
  DP     replicated parameters, gradients all-reduced over the dp dimension once per iteration
         after the schedule (layers/grad_sync.py: `DataParallelSync`; `apply_zero` groups them);
  ZeRO   DP with ZeRO-1 / ZeRO-2 over the dp dimension: layers/zero.py (reduce-scatter, sharded
         optimizer step, all-gather).
Between neighbouring layers whose data splits differ, the activation is redistributed
(layers/regroup.py, Galvatron §VI's Slice-Gather), also at the start of a stage, from the previous
stage's last layout.

Mixed precision: rank/mixed_precision.py (autocast around the step; FSDP2's
MixedPrecisionPolicy on the SDP layers).

Loss scaling: the last layer's devices each compute the loss of their slice; it is divided by the
slice count D so that the slices' losses add up to the micro-batch's loss. Every data-parallel
reduction is then a sum (FSDP2's gradient divide factor 1, our dp all-reduce a sum), whatever the
layer's own data degree.
"""


from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from paraplan.plans.axes import DATA, EXPERT_DATA, TENSOR
from paraplan.plans.plan import LayerStrategy, Plan, Recompute
from paraplan.runtime.layers.expert_parallel import apply_ep
from paraplan.runtime.layers.meshes import Meshes, stage_strategies
from paraplan.runtime.layers.regroup import StrategyLayer, replicated

# why context parallelism is not run: the runtime's refusal of the plan feature (runtime/kinds.py)
# tried (torch 2.13, 2 gloo ranks): context_parallel's ring attention raises "Operator
# aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
# registered"; it shards CUDA's fused attention kernels only
CONTEXT_PARALLEL_REFUSED = ("context parallelism is planned and simulated, not run (torch's context_parallel "
                            "shards only CUDA's fused attention kernels, not the CPU's)")


class HybridRefused(ValueError):
    """A plan the hybrid runtime cannot run; the message names the layer and the reason."""


@dataclass
class HybridStage:
    module: nn.Module  # what the PipelineStage runs
    layers: list[nn.Module]  # the raw layers (parameter paths as in the whole model)
    strategies: tuple[LayerStrategy, ...]
    last: LayerStrategy  # the layout of the stage's output
    dp_params: list[tuple[object, int, list[nn.Parameter]]]  # (dp process group, ZeRO stage, parameters)
    # SP norms' weights whose Partial gradients are summed over tp once per step (DataParallelSync)
    sequence_params: list[nn.Parameter]


# --- one apply step per axis ------------------------------------------------------------------------

def apply_cp(layer: nn.Module, strategy: LayerStrategy, meshes: Meshes) -> None:
    """Context parallelism: where torch's context_parallel (the sequence split over the cp
    sub-mesh, K and V passed round a ring) will go. Not run: a plan with cp > 1 is refused as a plan
    feature before any rank starts (runtime/kinds.py), so a layer reaching here with it is a bug."""
    if strategy.cp > 1:
        raise HybridRefused(CONTEXT_PARALLEL_REFUSED)


def apply_tp(layer: nn.Module, strategy: LayerStrategy, meshes: Meshes, memo: dict) -> None:
    """Tensor parallelism over the tp sub-mesh (layers/tensor_parallel.py: the layer family's DTensor
    plan), rewritten for sequence shards when the layer is also sequence parallel; `memo` keeps a
    parameter tied across the layers that share it."""
    if strategy.tp > 1:
        from paraplan.runtime.layers.tp_apply import apply_tensor_parallel

        apply_tensor_parallel(layer, meshes.sub(strategy, TENSOR), memo, strategy.sequence_parallel)


def apply_sp(layer: nn.Module, strategy: LayerStrategy) -> list[nn.Parameter]:
    """Sequence parallelism's own step after TP's plan: the norms' weights whose gradients come out
    Partial over tp, to be summed once per step (FSDP2 and ZeRO take them as they come)."""
    if strategy.tp > 1 and strategy.sequence_parallel and strategy.sdp == 1 and not strategy.zero:
        from paraplan.runtime.layers.sequence_parallel import partial_grad_params

        return partial_grad_params(layer)
    return []


def apply_recompute(layer: nn.Module, strategy: LayerStrategy) -> bool:
    """Activation recomputation: selective puts the attention core under a checkpoint now
    (layers/selective.py); full answers True, and the layer runs under a non-reentrant checkpoint
    (regroup.py: StrategyLayer), inside which FSDP2 re-gathers its parameters."""
    if strategy.recompute == Recompute.SELECTIVE:
        from paraplan.runtime.layers.selective import apply_selective

        apply_selective(layer)
    return strategy.checkpoint


def apply_fsdp(module: nn.Module | list[nn.Module], mesh, policy=None, ignored_params=None) -> None:
    """FSDP2 `fully_shard` over `mesh` (sdp, or (dp, sdp) for HSDP): a layer, a unit of layers
    sharing a parameter, or the stage as the root. The gradients' reduction is a plain sum: the loss
    is already divided by the slice count, and a custom factor would ask for PREMUL_SUM, which gloo
    lacks."""
    from torch.distributed.fsdp import fully_shard

    kwargs = {}
    if policy is not None:
        kwargs["mp_policy"] = policy
    if ignored_params is not None:
        kwargs["ignored_params"] = ignored_params
    fsdp = fully_shard(module, mesh=mesh, **kwargs)
    for m in (fsdp if isinstance(fsdp, list) else [fsdp]):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)


def apply_zero(layers: list[nn.Module], strategies: tuple[LayerStrategy, ...],
               meshes: Meshes, experts: dict[int, int] | None = None) -> list[tuple[object, int, list[nn.Parameter]]]:
    """The replicated layers' data parallelism: their parameters by (dp group, ZeRO stage), each
    group's gradients summed once per iteration after the schedule (grad_sync.py: DataParallelSync;
    ZeRO-1/2: zero.py's reduce-scatter, sharded step and all-gather). An expert-parallel layer's
    routed experts (`experts`: their ids, from `apply_ep`) are summed over their edp replicas instead,
    and not at all with one replica."""
    experts = experts or {}
    dp_params: dict[tuple[int, int], tuple[object, int, list[nn.Parameter]]] = {}
    seen: set[int] = set()
    for layer, st in zip(layers, strategies, strict=True):
        if st.dp > 1 and st.sdp == 1:
            group = meshes.sub(st, DATA).get_group()
            replicas = meshes.expert_sub(st, EXPERT_DATA) if st.ep > 1 else None
            for p in layer.parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if id(p) in experts:
                    if replicas.size() > 1:
                        g = replicas.get_group()
                        dp_params.setdefault((id(g), st.zero), (g, st.zero, []))[2].append(p)
                    continue
                dp_params.setdefault((id(group), st.zero), (group, st.zero, []))[2].append(p)
    return list(dp_params.values())


# --- the steps composed, per stage --------------------------------------------------------------------

def parallelize_stage(plan: Plan, stage_index: int, position: int, layers: list[nn.Module], meshes: Meshes,
                      stage_group, names: dict[int, str], seed: int, device) -> HybridStage:
    """Materialise the stage's layers (still on meta) one at a time and apply each one's strategy at
    once, in the order CP -> TP (+ SP) -> recomputation -> FSDP2; then the replicated layers' dp
    groups, each layer wrapped to regroup its input, and the stage as FSDP2's root."""
    from paraplan.runtime.rank.materialize import StageModule, materialize
    from paraplan.runtime.rank.mixed_precision import fsdp_policy

    policy = fsdp_policy(plan.precision)
    stage = plan.stages[stage_index]
    strategies = stage_strategies(stage)
    group_size = len(stage.devices)
    held = replicated(group_size) if stage_index == 0 else stage_strategies(plan.stages[stage_index - 1])[-1]
    # FSDP2 units: layers sharing a parameter (GPT-2's wte and tied head) in one unit
    sharded = [(i, layer) for i, (layer, st) in enumerate(zip(layers, strategies, strict=True)) if st.sdp > 1]
    unit_of = {i: unit for unit in tied_units(sharded) for i in unit}
    tp_memo: dict = {}
    sequence_params: list[nn.Parameter] = []
    full_recompute: list[bool] = []
    made: dict = {}  # one materialisation for the stage: tied parameters stay tied
    experts: dict[int, int] = {}  # the expert-parallel layers' routed experts (their own gradient sync)
    for i, (layer, st) in enumerate(zip(layers, strategies, strict=True)):
        materialize([layer], names, seed, device, made)
        apply_cp(layer, st, meshes)
        apply_tp(layer, st, meshes, tp_memo)
        experts.update((id(p), i) for p in apply_ep(layer, st, meshes))
        sequence_params += apply_sp(layer, st)
        # selective recomputation ran before TP until issue 47; it only points the attention modules'
        # config at the checkpointed core (layers/selective.py), which TP's plan does not touch, so the
        # order is torchtitan's now (test_sequence_parallel runs SP + selective against one process)
        full_recompute.append(apply_recompute(layer, st))
        if st.sdp > 1 and i == unit_of[i][-1]:  # the unit's last layer is materialised: shard the unit
            modules = [layers[j] for j in unit_of[i]]
            apply_fsdp(modules if len(modules) > 1 else modules[0], meshes.sharding(st), policy)
    dp_params = apply_zero(layers, strategies, meshes, experts)
    wrapped, previous = [], held
    for i, (layer, st) in enumerate(zip(layers, strategies, strict=True)):
        enter, leave = sequence_ends(layers, strategies, i)
        wrapped.append(StrategyLayer(layer, previous, st, position, stage_group, group_size,
                                     meshes.sub(st, TENSOR) if enter else None, leave, full_recompute[i]))
        previous = st
    module = StageModule(wrapped)
    if sharded:
        _shard_root(module, layers, strategies, meshes.sharding(strategies[sharded[0][0]]))
    return HybridStage(module, layers, strategies, previous, dp_params, sequence_params)


def _shard_root(module: nn.Module, layers: list[nn.Module], strategies: tuple[LayerStrategy, ...], mesh) -> None:
    """The stage itself becomes the FSDP2 root, managing no parameter of its own: FSDP2 needs a
    single root above a unit of several modules (the tied embedding and head), and with the root the
    pipeline stage holds every unit's gradient reduction until the last micro-batch
    (PipelineStage.perform_reduce_grad), one reduce-scatter per layer per iteration."""
    import warnings

    others = {p for layer, st in zip(layers, strategies, strict=True) if st.sdp == 1 for p in layer.parameters()}
    # the stage's output may be a view (StageModule makes it contiguous, which can return it as
    # is): FSDP2 warns that an in-place op on it would skip its hook; nothing here does one
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    apply_fsdp(module, mesh, ignored_params=others)


def sequence_ends(layers: list[nn.Module], strategies: tuple[LayerStrategy, ...], i: int) -> tuple[bool, bool]:
    """(layer i cuts its whole input into sequence shards, layer i gathers its sharded output whole):
    the shards pass as they are only from an SP layer that gives them to the next SP layer of the
    stage that takes them, under the same layout (the same tp mesh and data slices)."""
    from paraplan.runtime.layers.sequence_parallel import sequence_io

    def io(j):
        return sequence_io(layers[j]) if 0 <= j < len(layers) and strategies[j].sequence_parallel else (False, False)

    def kept(a, b):  # layer a's sharded output is layer b's input as it is
        return io(a)[1] and io(b)[0] and strategies[a].dims == strategies[b].dims

    return io(i)[0] and not kept(i - 1, i), io(i)[1] and not kept(i, i + 1)


def tied_units(indexed: list[tuple[int, nn.Module]]) -> list[list[int]]:
    """Layers that share a parameter, grouped (union-find over shared parameters)."""
    owner: dict[int, int] = {}
    parent = {i: i for i, _ in indexed}

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, layer in indexed:
        for p in layer.parameters():
            if id(p) in owner:
                parent[find(i)] = find(owner[id(p)])
            else:
                owner[id(p)] = i
    units: dict[int, list[int]] = {}
    for i, _ in indexed:
        units.setdefault(find(i), []).append(i)
    return list(units.values())
