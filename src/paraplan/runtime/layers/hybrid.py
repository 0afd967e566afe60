"""Galvatron-BMW plans for real: each layer of a pipeline stage runs under its own strategy.

A stage with per-layer strategies runs on its whole device group G for every micro-batch (unlike
the pipeline x data-parallel path, where each device of a stage is an independent pipeline replica).
Device at position j of stage s talks to position j of the neighbouring stages (pipeline group j).

Layout: one definition, shared with the simulator (`costs/strategy.py`): `LayerStrategy.order`
lists the dimensions inner-most first; the inner-most dimension's groups are consecutive devices
of the stage (`strategy_groups`), and the device at position j processes the micro-batch slice
`data_rank(strategy, j)` of `data_degree` slices. Every distinct layout of the plan becomes one
`DeviceMesh` over all stages, shape (pp, outer..., inner): reshaping a stage's device list
row-major makes the last (inner-most) mesh dimension vary fastest, which is `strategy_groups`'s
layout.

Per layer (Galvatron-BMW §III), with the field's tools:
  SDP    FSDP2 `fully_shard` over the sdp dimension (dp x sdp: HSDP, the 2-D mesh (dp, sdp));
  TP     DTensor `parallelize_module` (runtime/layers/tensor_parallel.py), before FSDP2 when both;
         with `sequence_parallel`, Megatron's SP (runtime/layers/sequence_parallel.py): consecutive SP
         layers of a stage pass sequence-sharded DTensors, `StrategyLayer` cuts and gathers them
         at the ends of such a run (`_sequence_ends`);
  DP     replicated parameters, gradients all-reduced over the dp dimension once per iteration
         after the schedule (`DataParallelSync`), as the simulator prices the stage's dp sync
         (one all-reduce per iteration, `grad_allreduce_bytes`). FSDP2's `replicate` was the other
         choice: it reduces after every micro-batch's backward unless the pipeline stage is itself
         the FSDP root, and here the root holds layers of other strategies;
  ZeRO   DP with ZeRO-1 / ZeRO-2 over the dp dimension: runtime/layers/zero.py (reduce-scatter, sharded
         optimizer step, all-gather);
  CKPT   `torch.utils.checkpoint` (non-reentrant) around the layer (FSDP2 re-gathers inside the
         recomputation, as its hooks run again); selective recomputation checkpoints only the
         attention core (runtime/layers/selective.py).
Between neighbouring layers whose data splits differ, the activation is redistributed
(`Regroup`, Galvatron §VI's Slice-Gather): a slice the device already holds is cut locally; a
missing one is all-gathered over the stage group (more bytes than the minimum the simulator prices
for some pairs; said where it applies). The same happens at the start of a stage, from the
previous stage's last layout.

Mixed precision: runtime/rank/mixed_precision.py (autocast around the step; FSDP2's
MixedPrecisionPolicy on the SDP layers).

Loss scaling: the last layer's devices each compute the loss of their slice; it is divided by the
slice count D so that the slices' losses add up to the micro-batch's loss. Every data-parallel
reduction is then a sum (FSDP2's gradient divide factor 1, our dp all-reduce a sum), whatever the
layer's own data degree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from paraplan.costs.strategy import data_rank
from paraplan.plans.axes import DATA, LAYER_AXES, PIPELINE, SHARDED_DATA, TENSOR, Axis
from paraplan.plans.plan import LayerStrategy, Plan, Stage
from paraplan.runtime.measure.memory_meter import local_value

Layout = tuple[tuple[Axis, int], ...]  # LayerStrategy.dims: (axis, degree), inner-most first


def stage_strategies(stage: Stage) -> tuple[LayerStrategy, ...]:
    """One strategy per layer of the stage; a stage without strategies is pure data parallel."""
    return tuple(stage.strategy(i) for i in stage.layers)


def replicated(group_size: int) -> LayerStrategy:
    """What every device of a group holds when it holds the whole micro-batch (the input batch)."""
    return LayerStrategy(tp=group_size)


def data_rows(strategy: LayerStrategy, position: int, rows: int) -> slice:
    """The rows of a micro-batch of `rows` samples the device at `position` processes."""
    n = strategy.data_degree
    r = data_rank(strategy, position)
    return slice(r * rows // n, (r + 1) * rows // n)


class HybridRefused(ValueError):
    """A plan the hybrid runtime cannot run; the message names the layer and the reason."""


# --- meshes ----------------------------------------------------------------------------------------

class Meshes:
    """One DeviceMesh per distinct layout of the plan, created in the same order on every rank
    (mesh creation is collective)."""

    def __init__(self, plan: Plan, device_type: str):
        from torch.distributed.device_mesh import DeviceMesh

        layouts = sorted({st.dims for stage in plan.stages for st in stage_strategies(stage) if st.dims})
        self._meshes: dict[Layout, DeviceMesh] = {}
        for layout in layouts:
            outer_first = list(reversed(layout))
            # one row per pipeline rank (the chunks of an interleaved rank share its devices)
            groups = list(dict.fromkeys(tuple(s.devices) for s in plan.stages))
            shape = [len(groups)] + [k for _, k in outer_first]
            ranks = torch.tensor([list(g) for g in groups]).reshape(shape)
            # the groups are fixed by which ranks share a row, not by the order of the mesh's
            # dimensions: put them in one canonical order (the axis table's, outer-most first: dp,
            # sdp, cp, tp), so that HSDP's (replicate, shard) = (dp, sdp) slice is in ascending order
            # for any layout
            names = [PIPELINE.name] + [a.name for a, _ in outer_first]
            canonical = [PIPELINE.name] + [a.name for a in reversed(LAYER_AXES) if a.name in names]
            ranks = ranks.permute([names.index(d) for d in canonical])
            self._meshes[layout] = DeviceMesh(device_type, ranks, mesh_dim_names=tuple(canonical))

    def sub(self, strategy: LayerStrategy, *axes: Axis):
        """The sub-mesh of `strategy`'s layout over `axes` (outer first), for this rank."""
        names = tuple(a.name for a in axes)
        return self._meshes[strategy.dims][names if len(names) > 1 else names[0]]


# --- Slice-Gather ----------------------------------------------------------------------------------

def _gather_rows(local: torch.Tensor, held: LayerStrategy, group, group_size: int) -> torch.Tensor:
    """The whole micro-batch from every device's slice under `held` (one device per slice)."""
    parts = [torch.empty_like(local) for _ in range(group_size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    first = {}
    for position in range(group_size):
        first.setdefault(data_rank(held, position), position)
    return torch.cat([parts[first[r]] for r in range(held.data_degree)])


def _contained(inner: LayerStrategy, outer: LayerStrategy, group_size: int) -> bool:
    """Whether on every device the rows it needs under `inner` lie within what it holds under `outer`
    (uniform over the group, so that all devices take the same branch of a collective)."""
    rows = inner.data_degree * outer.data_degree
    for p in range(group_size):
        a, b = data_rows(inner, p, rows), data_rows(outer, p, rows)
        if not (b.start <= a.start and a.stop <= b.stop):
            return False
    return True


def _redistribute(x: torch.Tensor, held: LayerStrategy, wanted: LayerStrategy, position: int, group,
                  group_size: int) -> torch.Tensor:
    """This device's slice under `wanted`, from every device's slice under `held`."""
    rows = x.shape[0] * held.data_degree
    if _contained(wanted, held, group_size):  # cut what this device has: free
        start = data_rows(held, position, rows).start
        cut = data_rows(wanted, position, rows)
        return x[cut.start - start:cut.stop - start].clone()
    return _gather_rows(x, held, group, group_size)[data_rows(wanted, position, rows)].clone()


class _Regroup(torch.autograd.Function):
    """From the slices of `held` to those of `wanted` (forward), and the gradient back, the same
    redistribution the other way (backward). A value held by several devices (tensor-parallel
    replicas) is the same on each, and so is its gradient: every holder gets the full gradient of
    its slice."""

    @staticmethod
    def forward(ctx, x, held, wanted, position, group, group_size):
        ctx.args = (held, wanted, position, group, group_size)
        return _redistribute(x, held, wanted, position, group, group_size)

    @staticmethod
    def backward(ctx, grad):
        held, wanted, position, group, group_size = ctx.args
        return _redistribute(grad, wanted, held, position, group, group_size), None, None, None, None, None


def regroup(value, held: LayerStrategy, wanted: LayerStrategy, position: int, group, group_size: int):
    """Slice-Gather `value` (a tensor, or a tuple of them, batch-first) from `held` to `wanted`."""
    if held.data_degree == wanted.data_degree and all(
            data_rank(held, p) == data_rank(wanted, p) for p in range(group_size)):
        return value
    if isinstance(value, tuple):
        return tuple(regroup(v, held, wanted, position, group, group_size) for v in value)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    if not value.requires_grad:  # token ids, images: no gradient to carry back
        return _redistribute(value, held, wanted, position, group, group_size)
    return _Regroup.apply(value, held, wanted, position, group, group_size)


# --- one layer under its strategy ------------------------------------------------------------------

class StrategyLayer(nn.Module):
    """A layer of the model under its strategy: its input regrouped from the previous layer's
    layout, then the layer itself (tensor parallel / sharded inside), checkpointed if asked.
    Sequence parallelism (runtime/layers/sequence_parallel.py): `enter` (a mesh) cuts the whole input into
    this rank's part of the sequence first, `leave` gathers the sequence-sharded output whole after;
    between consecutive SP layers of one layout neither is set and the Shard(1) DTensor passes."""

    def __init__(self, layer: nn.Module, held: LayerStrategy, strategy: LayerStrategy, position: int, group,
                 group_size: int, enter=None, leave: bool = False):
        super().__init__()
        self.layer = layer
        self.held, self.strategy, self.position = held, strategy, position
        self._group, self.group_size = group, group_size
        self._enter, self.leave = enter, leave

    def forward(self, x):
        x = regroup(x, self.held, self.strategy, self.position, self._group, self.group_size)
        if self._enter is not None or self.leave:
            from paraplan.runtime.layers.sequence_parallel import to_shards, to_whole

            if self._enter is not None:
                x = to_shards(x, self._enter)
        if self.strategy.checkpoint:
            from torch.utils.checkpoint import checkpoint

            from paraplan.runtime.measure.memory_meter import note_checkpoint_input

            note_checkpoint_input(x)
            y = checkpoint(self.layer, x, use_reentrant=False)
        else:
            y = self.layer(x)
        return to_whole(y) if self.leave else y


@dataclass
class HybridStage:
    module: nn.Module  # what the PipelineStage runs
    layers: list[nn.Module]  # the raw layers (parameter paths as in the whole model)
    strategies: tuple[LayerStrategy, ...]
    last: LayerStrategy  # the layout of the stage's output
    dp_params: list[tuple[object, int, list[nn.Parameter]]]  # (dp process group, ZeRO stage, parameters)
    # SP norms' weights whose Partial gradients are summed over tp once per step (DataParallelSync)
    sequence_params: list[nn.Parameter]


def build_stage(plan: Plan, stage_index: int, position: int, layers: list[nn.Module], meshes: Meshes,
                stage_group, names: dict[int, str], seed: int, device) -> HybridStage:
    """Materialise the stage's layers (still on meta) one at a time and apply each one's strategy
    at once, in the order TP -> FSDP2 -> CKPT: a rank holds at most one layer whole (or one unit of
    layers sharing a parameter) before it is split or sharded, never the stage."""
    from torch.distributed.fsdp import fully_shard

    from paraplan.runtime.rank.materialize import StageModule, materialize
    from paraplan.runtime.rank.mixed_precision import fsdp_policy

    policy = fsdp_policy(plan.precision)

    stage = plan.stages[stage_index]
    strategies = stage_strategies(stage)
    group_size = len(stage.devices)
    if stage_index == 0:
        held = replicated(group_size)
    else:
        held = stage_strategies(plan.stages[stage_index - 1])[-1]
    # FSDP2 units: layers sharing a parameter (GPT-2's wte and tied head) in one unit
    sharded = [(i, layer) for i, (layer, st) in enumerate(zip(layers, strategies, strict=True)) if st.sdp > 1]
    unit_of = {i: unit for unit in _tied_units(sharded) for i in unit}
    tp_memo: dict = {}
    sequence_params: list[nn.Parameter] = []
    made: dict = {}  # one materialisation for the stage: tied parameters stay tied
    for i, (layer, st) in enumerate(zip(layers, strategies, strict=True)):
        materialize([layer], names, seed, device, made)
        if st.recompute == "selective":  # the attention core under a checkpoint (runtime/layers/selective.py)
            from paraplan.runtime.layers.selective import apply_selective

            apply_selective(layer)
        if st.tp > 1:
            from paraplan.runtime.layers.tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(layer, meshes.sub(st, TENSOR), tp_memo, st.sequence_parallel)
            if st.sequence_parallel and st.sdp == 1 and not st.zero:  # FSDP2 and ZeRO take them as they come
                from paraplan.runtime.layers.sequence_parallel import partial_grad_params

                sequence_params += partial_grad_params(layer)
        if st.sdp > 1 and i == unit_of[i][-1]:  # the unit's last layer is materialised: shard the unit
            mesh = meshes.sub(st, DATA, SHARDED_DATA) if st.dp > 1 else meshes.sub(st, SHARDED_DATA)
            modules = [layers[j] for j in unit_of[i]]
            fsdp = fully_shard(modules if len(modules) > 1 else modules[0], mesh=mesh, mp_policy=policy)
            for m in (fsdp if isinstance(fsdp, list) else [fsdp]):
                m.set_gradient_divide_factor(1.0)  # a sum: the loss is already divided by the slice count
                # plain sums on the wire: a custom factor otherwise asks for PREMUL_SUM, which gloo lacks
                m.set_force_sum_reduction_for_comms(True)
    dp_params: dict[tuple[int, int], tuple[object, int, list[nn.Parameter]]] = {}
    seen: set[int] = set()
    for layer, st in zip(layers, strategies, strict=True):
        if st.dp > 1 and st.sdp == 1:
            group = meshes.sub(st, DATA).get_group()
            for p in layer.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    dp_params.setdefault((id(group), st.zero), (group, st.zero, []))[2].append(p)
    wrapped, previous = [], held
    for i, (layer, st) in enumerate(zip(layers, strategies, strict=True)):
        enter, leave = _sequence_ends(layers, strategies, i)
        wrapped.append(StrategyLayer(layer, previous, st, position, stage_group, group_size,
                                     meshes.sub(st, TENSOR) if enter else None, leave))
        previous = st
    module = StageModule(wrapped)
    if sharded:
        # The stage itself becomes the FSDP2 root, managing no parameter of its own: FSDP2 needs a
        # single root above a unit of several modules (the tied embedding and head), and with the
        # root the pipeline stage holds every unit's gradient reduction until the last micro-batch
        # (PipelineStage.perform_reduce_grad), one reduce-scatter per layer per iteration.
        first = strategies[sharded[0][0]]
        mesh = meshes.sub(first, DATA, SHARDED_DATA) if first.dp > 1 else meshes.sub(first, SHARDED_DATA)
        others = {p for layer, st in zip(layers, strategies, strict=True) if st.sdp == 1 for p in layer.parameters()}
        import warnings

        # the stage's output may be a view (StageModule makes it contiguous, which can return it
        # as is): FSDP2 warns that an in-place op on it would skip its hook; nothing here does one
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        root = fully_shard(module, mesh=mesh, ignored_params=others)
        root.set_gradient_divide_factor(1.0)
        root.set_force_sum_reduction_for_comms(True)
    return HybridStage(module, layers, strategies, previous, list(dp_params.values()), sequence_params)


def _sequence_ends(layers: list[nn.Module], strategies: tuple[LayerStrategy, ...], i: int) -> tuple[bool, bool]:
    """(layer i cuts its whole input into sequence shards, layer i gathers its sharded output whole):
    the shards pass as they are only from an SP layer that gives them to the next SP layer of the
    stage that takes them, under the same layout (the same tp mesh and data slices)."""
    from paraplan.runtime.layers.sequence_parallel import sequence_io

    def io(j):
        return sequence_io(layers[j]) if 0 <= j < len(layers) and strategies[j].sequence_parallel else (False, False)

    def kept(a, b):  # layer a's sharded output is layer b's input as it is
        return io(a)[1] and io(b)[0] and strategies[a].dims == strategies[b].dims

    return io(i)[0] and not kept(i - 1, i), io(i)[1] and not kept(i, i + 1)


def _tied_units(indexed: list[tuple[int, nn.Module]]) -> list[list[int]]:
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


class DataParallelSync:
    """The dp dimension's gradient all-reduce (a sum), once per iteration, one flattened
    all-reduce per dp group; for tensor-parallel parameters, on their local shards. Before it, the
    sequence-parallel norms' Partial gradients are summed over their tp ranks (`sequence_params`). Layers with
    ZeRO-1/2 go to runtime/layers/zero.py's `ZeroSync`, one per (dp group, stage): the optimizer steps
    its `views` instead of those parameters (`optimizer_params`), and `gather` follows the step."""

    def __init__(self, groups: list[tuple[object, int, list[nn.Parameter]]], recorder=None,
                 sequence_params: list[nn.Parameter] | None = None):
        from paraplan.runtime.layers.zero import ZeroSync

        self.sequence_params = sequence_params or []
        self.groups = [(group, params) for group, zero, params in groups if not zero]
        self.zero = [ZeroSync(group, params, zero, recorder) for group, zero, params in groups if zero]
        self.recorder = recorder

    def optimizer_params(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """What the optimizer steps: `params`, with ZeRO's parameters replaced by its owned views."""
        sharded = {id(p) for z in self.zero for p in z.params}
        return [p for p in params if id(p) not in sharded] + [v for z in self.zero for v in z.views]

    def held_grad_bytes(self) -> int:
        """Gradient bytes held outside the parameters' .grad (ZeRO-2's accumulators)."""
        return sum(z.held_grad_bytes() for z in self.zero)

    def gather(self) -> None:
        for z in self.zero:
            z.gather()

    def finish(self) -> None:
        import time

        if self.sequence_params:  # (no ZeRO layer among them; the dp all-reduce below then sums tp sums)
            from paraplan.runtime.layers.sequence_parallel import sum_partial_grads

            start = time.time()
            sum_partial_grads(self.sequence_params)
            if self.recorder is not None:
                self.recorder.add("allreduce", "allreduce", -1, start, time.time())
        for z in self.zero:
            z.finish()
        start = time.time()
        for group, params in self.groups:
            grads = [local_value(p.grad) for p in params if p.grad is not None]
            if not grads:
                continue
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        if self.recorder is not None and self.groups:
            self.recorder.add("allreduce", "allreduce", -1, start, time.time())


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one whole tensor (collective over its mesh for a DTensor)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def squared_norm(params: Iterable[nn.Parameter]) -> torch.Tensor:
    """The sum of squares of the gradients' whole values (DTensors gathered: every device of the
    stage calls this in the same order)."""
    total = torch.zeros(())
    for p in params:
        if p.grad is not None:
            total = total + full_value(p.grad).double().pow(2).sum().to(total.device)
    return total


def hybrid_refusal(plan: Plan, layers: list) -> str | None:
    """Why a plan with per-layer strategies cannot run (one line naming the layer), or None.
    `layers` is the model's (name, kind, module) list; only inspected, never run."""
    rows = plan.global_batch // plan.n_micro
    holders: dict[int, list[tuple[int, str, LayerStrategy]]] = {}
    for stage in plan.stages:
        for index, st in zip(stage.layers, stage_strategies(stage), strict=True):
            name, _, module = layers[index]
            where = f"layer {index} ({name}, {st})"
            if rows % st.data_degree:
                return (f"{where}: a micro-batch of {rows} samples does not split into {st.data_degree} "
                        f"data-parallel slices")
            if st.cp > 1:
                # tried (torch 2.13, 2 gloo ranks): context_parallel's ring attention raises "Operator
                # aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
                # strategy registered"; it shards CUDA's fused attention kernels only
                return (f"{where}: context parallelism is planned and simulated, not run (torch's context_parallel "
                        f"shards only CUDA's fused attention kernels, not the CPU's)")
            if st.zero and st.sdp > 1:
                return f"{where}: ZeRO-{st.zero} over the dp replicas of a sharded (sdp) layer is not run"
            if st.tp > 1:
                from paraplan.runtime.layers.tensor_parallel import strict_for, tp_refusal

                strict = strict_for(plan.model)  # outside the zoo every Linear must be sharded
                reason = tp_refusal(module, st.tp, strict=strict)
                if reason:
                    return f"{where}: no tensor parallelism: {reason}"
                if st.sequence_parallel and (reason := tp_refusal(module, st.tp, sequence_parallel=True,
                                                                  strict=strict)):
                    return f"{where}: no sequence parallelism: {reason}"
            for p in module.parameters():
                holders.setdefault(id(p), []).append((index, name, st))
    stage_of = {i: s for s, stage in enumerate(plan.stages) for i in stage.layers}
    for uses in holders.values():
        if any(st.zero for _, _, st in uses) and len({stage_of[i] for i, _, _ in uses}) > 1:
            i, name, st = uses[0]
            return (f"layer {i} ({name}, {st}): a weight tied across stages with ZeRO-{st.zero} is not run (its "
                    f"gradient is summed between stages after ZeRO's reduce-scatter)")
        layouts = {(st.dp, st.sdp, st.tp, st.order) for _, _, st in uses}
        if len(layouts) > 1:
            (i, a, sa), (j, b, sb) = uses[0], next(u for u in uses if (u[2].dp, u[2].sdp, u[2].tp, u[2].order)
                                                  != (uses[0][2].dp, uses[0][2].sdp, uses[0][2].tp, uses[0][2].order))
            return (f"layers {i} ({a}, {sa}) and {j} ({b}, {sb}) share a parameter (tied weights) and must have "
                    f"the same strategy")
    return None
