"""Peak memory of every device under a plan, from the per-layer strategy costs (costs/strategy.py).

Per device of a stage:
  model states  = the states of every layer whose backward (and update) the stage runs, sharded by
                  tp x sdp (costs/strategy.py: fp32 Adam, 16 bytes per parameter by default), with
                  ZeRO-1/2 the optimizer states / and gradients sharded over the dp replicas too;
                  Bi-Partition: a layer whose forward runs here but whose backward runs elsewhere
                  costs only a copy of its latest weights (the paper's "partial copy");
  activations   = for each layer whose backward runs here, its saved tensors (costs/strategy.py) times
                  the micro-batches in flight between its forward and this backward: GPipe keeps all
                  n_micro; 1F1B keeps min(n_stages - stage, n_micro) (Galvatron §II-B); with the
                  forward on stage a and the backward on stage b (Bi-Partition, which sends the
                  activations to the backward owner), ceil(n_stages - (a + b) / 2) (the steady state
                  has one forward and one backward per stage per cycle, and a pass moves one stage per
                  half cycle), plus one checkpointed layer's recomputation;
  weight stash  = async 1F1B (PipeDream) keeps n_stages - stage - 1 older weight versions;
  reserve       = the CUDA context, cuBLAS workspace and NCCL buffers: once per device, 0 on a CPU;
  compute copies  mixed precision (bf16 / fp16): autocast's 16-bit copy of every weight the device
                runs forward (costs/memory_config.py: compute_copy_bytes_per_param); the states stay
                fp32, and the activations are the model's in its compute dtype (CostModel.precision).
A tied weight used on a stage that does not hold its owner (GPT-2's head) is a second copy there.

What a real PyTorch run holds beyond those (costs/memory_config.py names the source of each):
  allocator     the caching allocator's reserve over the activations (`allocator_fraction` of them;
                costs/strategy.py applies it through `activation_scale`, so the planners' fast counts
                agree); shown apart in the breakdown;
  tp replicas   Megatron (tp > 1) holds the inputs of the layer norms and column-parallel linears
                whole on every rank: (1 - 1/tp) x `tp_replicated_outputs` x the layer's output,
                per micro-batch in flight; none with sequence parallelism, which splits them too;
  sdp buffers   FSDP / ZeRO-3 (sdp > 1): the gathered weights of `sdp_gathered_layers` layers (the one
                computing and the one prefetched) and one unsharded gradient, the largest of the stage;
  ddp buckets   DDP (grad_sync "bucketed", dp > 1): a flat copy of the gradients of the dp layers.

Two moments can be the peak, and the device's peak is the larger:
  forward/backward  reserve + states + activations (+ allocator) + tp replicas + sdp buffers
                    (zero_grad sets gradients to None (torch >= 2.0's default), so while the
                    activations peak, DDP's buckets stand where the gradients counted in `states`
                    are not yet);
  optimizer step    reserve + states + ddp buckets + Adam's step temporaries (the activations are
                    freed; the gradients and the buckets are both alive).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.costs.expert_costs import held_params, sharded_params, stepped_params
from paraplan.costs.memory_config import GIB, MemoryConfig
from paraplan.costs.strategy import layer_memory, param_count
from paraplan.models.spec import ModelSpec
from paraplan.plans import live_peak, schedules
from paraplan.plans.kinds import PlanKind
from paraplan.plans.live_peak import micro_batches_in_flight
from paraplan.plans.plan import DeviceMemory, LayerStrategy, Plan
from paraplan.plans.stage_widths import stage_rows
from paraplan.plans.worker_roles import worker_roles

__all__ = ["GIB", "MEMORY_CATEGORIES", "MemoryBreakdown", "MemoryConfig", "PeakRow", "by_category", "loss_gradient_bytes", "micro_batches_in_flight", "out_of_memory_reason",
           "plan_memory", "sdp_buffer_bytes", "stage_memory", "tp_replicated_bytes"]


# what MemoryBreakdown.at_peak names, in the order tables show them
MEMORY_CATEGORIES = ("parameters", "16-bit weight copies", "gradients", "optimizer states", "activations",
                     "gradients awaiting the weight pass", "the loss's gradients",
                     "gathered weights kept for the step", "unsharded gradients kept for the step",
                     "communication buffers", "allocator reserve", "CUDA context and libraries", "weight stash",
                     "optimizer temporaries")


@dataclass(frozen=True)
class MemoryBreakdown:
    device: int
    stage: int
    states_bytes: float
    activation_bytes: float  # the tensors autograd keeps (+ one layer's recomputation), allocator excluded
    stash_bytes: float
    reserve_bytes: float  # CUDA context, cuBLAS workspace, NCCL buffers (0 on a CPU)
    in_flight: int
    allocator_bytes: float = 0.0  # the caching allocator's reserve over the activations
    tp_replicated_bytes: float = 0.0  # Megatron's activations not split tp ways
    sdp_buffer_bytes: float = 0.0  # FSDP / ZeRO-3 gathered weights and unsharded gradient
    ddp_bucket_bytes: float = 0.0  # DDP's flat gradient copy
    optimizer_step_bytes: float = 0.0  # Adam's step temporaries (counted at the step, not the forward)
    compute_copy_bytes: float = 0.0  # mixed precision: autocast's 16-bit copies of the weights run forward here
    # the states' parts (states_bytes = param_state_bytes + grad_bytes + optimizer_bytes)
    param_state_bytes: float = 0.0
    grad_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    # the part of activation_bytes that is one checkpointed layer's recomputation (during its backward)
    recompute_bytes: float = 0.0
    # a split backward (zero-bubble): the gradients the input pass keeps for the weight pass, of the
    # micro-batches between the two (LayerSpec.weight_grad_input_bytes), at the activations' peak
    weight_pass_bytes: float = 0.0
    # the stage holding the loss: its backward's gradients (of the fp32 log-softmax, of the logits),
    # alive while every layer's activations still are (LayerSpec.loss_gradient_bytes)
    loss_gradient_bytes: float = 0.0
    # FSDP under pipelining (torchtitan): the stage's gathered weights and unsharded gradients, kept
    # across micro-batches until its last backward (MemoryConfig.pipeline_keeps_sdp_units)
    kept_weight_bytes: float = 0.0
    kept_grad_bytes: float = 0.0

    @property
    def forward_peak_bytes(self) -> float:
        """During the forward and backward. DDP's buckets are not added: `states` counts a gradient per
        parameter that does not exist yet while the activations peak (zero_grad sets it to None), and
        the buckets stand in its place; both are alive only once the activations are freed (the step)."""
        return (self.states_bytes + self.activation_bytes + self.allocator_bytes + self.stash_bytes
                + self.reserve_bytes + self.tp_replicated_bytes + self.sdp_buffer_bytes + self.compute_copy_bytes
                + self.weight_pass_bytes + self.loss_gradient_bytes + self.kept_weight_bytes
                + self.kept_grad_bytes)

    @property
    def step_peak_bytes(self) -> float:
        """During the optimizer step: the activations are freed, gradients and buckets both alive."""
        return (self.states_bytes + self.stash_bytes + self.reserve_bytes + self.ddp_bucket_bytes
                + self.optimizer_step_bytes)

    @property
    def peak_bytes(self) -> float:
        return max(self.forward_peak_bytes, self.step_peak_bytes)

    def at_peak(self) -> tuple[str, tuple[tuple[str, float], ...]]:
        """The moment of this device's peak ("forward/backward" or "optimizer step") and what it
        holds then, by category, largest first; the bytes sum to `peak_bytes`."""
        states = (("parameters", self.param_state_bytes), ("gradients", self.grad_bytes),
                  ("optimizer states", self.optimizer_bytes))
        common = (*states, ("weight stash", self.stash_bytes), ("CUDA context and libraries", self.reserve_bytes))
        if self.forward_peak_bytes >= self.step_peak_bytes:
            moment, parts = "forward/backward", (*common, ("16-bit weight copies", self.compute_copy_bytes),
                                                ("activations", self.activation_bytes + self.tp_replicated_bytes),
                                                ("gradients awaiting the weight pass", self.weight_pass_bytes),
                                                ("the loss's gradients", self.loss_gradient_bytes),
                                                ("gathered weights kept for the step", self.kept_weight_bytes),
                                                ("unsharded gradients kept for the step", self.kept_grad_bytes),
                                                ("communication buffers", self.sdp_buffer_bytes),
                                                ("allocator reserve", self.allocator_bytes))
        else:
            moment, parts = "optimizer step", (*common, ("communication buffers", self.ddp_bucket_bytes),
                                              ("optimizer temporaries", self.optimizer_step_bytes))
        return moment, tuple(sorted(((n, b) for n, b in parts if b > 0), key=lambda x: -x[1]))


@dataclass(frozen=True)
class PeakRow:
    """One stage's device at its peak: the moment and the bytes by category (`at_peak`)."""

    breakdown: MemoryBreakdown
    moment: str
    parts: dict[str, float]


def by_category(breakdowns) -> tuple[tuple[str, ...], tuple[PeakRow, ...]]:
    """The categories any device holds at its peak (in MEMORY_CATEGORIES order) and every stage's
    row, heaviest first: what the command line's table, the HTML report and `simulate --json` show."""
    rows = []
    for b in sorted(breakdowns, key=lambda b: -b.peak_bytes):
        moment, parts = b.at_peak()
        rows.append(PeakRow(b, moment, dict(parts)))
    used = tuple(c for c in MEMORY_CATEGORIES if any(c in r.parts for r in rows))
    return used, tuple(rows)


_OWNERS: list = [None, {}]  # the last plan's stages (held, so their id stays theirs) and its forward owners


def stage_memory(plan: Plan, model: ModelSpec, stage_index: int, config: MemoryConfig | None = None,
                 device_kind: str | None = None, in_flight: int | None = None,
                 on_device: frozenset[int] = frozenset()) -> MemoryBreakdown:
    """One device of stage `stage_index`; `device_kind` (its DeviceSpec.name) drops the CUDA-only
    terms on a CPU (MemoryConfig.for_device_kind); unknown is treated as a CUDA device. `in_flight`:
    the micro-batches the stage holds at the moment asked about (default: its schedule's peak);
    `on_device`: layers other stages hold on the same device (a tied weight there is no second copy)."""
    config = (config or MemoryConfig()).for_device_kind(device_kind)
    stage = plan.stages[stage_index]
    micro = plan.global_batch / plan.n_micro  # entering the stage's group; strategies split it further
    if _OWNERS[0] is not plan.stages:  # {layer: the (last) stage running its forward}, once for a plan's stages
        _OWNERS[:] = [plan.stages, {i: s for s, st in enumerate(plan.stages) for i in st.layers}]
    forward_owner = _OWNERS[1]
    held = set(stage.layers) | set(stage.backward)
    states = stash = activations = recompute = 0.0
    param_states = grads = optimizer_states = 0.0
    tp_replicated = ddp_grads = optimizer_params = compute_copies = 0.0
    gathered = [0.0]  # the unsharded weights of each sdp layer
    # FSDP under pipelining (MemoryConfig.pipeline_keeps_sdp_units): the stage's units stay gathered,
    # their gradients unsharded, across the micro-batches; in place of the per-layer buffers
    keeps_units = config.pipeline_keeps_sdp_units and plan.n_ranks > 1
    kept_weights = kept_grads = 0.0
    in_flight_here = micro_batches_in_flight(plan.schedule, plan.n_stages, stage_index, plan.n_micro) \
        if in_flight is None else in_flight
    ddp = plan.grad_sync == "bucketed"
    # Bi-Partition run as the runtime runs it (plans/worker_roles.py): a layer whose forward ran on
    # another worker keeps no activations here between its forward and backward; its forward is
    # recomputed just before its backward, one micro-batch at a time, from one input tensor
    role = worker_roles(plan)[stage_index] if plan.kind is PlanKind.BIPARTITION and \
        plan.split_layers == "recompute" else None
    recomputed = set(role.recomputed) if role is not None else set()
    for i in sorted(held):
        layer = model.layers[i]
        tied_copy = bool(layer.shared_param_bytes) and any(o not in held and o not in on_device
                                                           for o in layer.shared_owners)
        strategy = stage.strategy(i)
        m = layer_memory(model, i, strategy, micro, config, tied_copy)
        params = param_count(model, i, tied_copy)
        if i in stage.backward:
            states += m.states_bytes
            param_states, grads, optimizer_states = (param_states + m.param_bytes, grads + m.grad_bytes,
                                                     optimizer_states + m.optimizer_bytes)
            # ZeRO-1/2: each rank of dp x cp steps its share of the optimizer states
            optimizer_params += stepped_params(layer, params, strategy)
            waiting = in_flight_here if forward_owner[i] == stage_index else micro_batches_in_flight(
                plan.schedule, plan.n_stages, stage_index, plan.n_micro, forward_owner[i])
            if i not in recomputed:
                activations += waiting * m.saved_bytes
            recompute = max(recompute, m.recompute_bytes)
            tp_replicated += waiting * tp_replicated_bytes(model, i, strategy, micro, config)
            if strategy.sdp > 1 and keeps_units:
                kept_weights += held_params(layer, params, strategy) * (layer.gathered_element_bytes
                                                                        or gathered_bytes_per_param(config))
                kept_grads += held_params(layer, params, strategy) * config.grad_bytes_per_param
            elif strategy.sdp > 1:
                gathered.append(held_params(layer, params, strategy))
            if ddp and strategy.dp > 1 and strategy.zero < 2:  # ZeRO-2 reduce-scatters, no full buckets
                ddp_grads += sharded_params(layer, params, strategy)
        else:  # Bi-Partition: forward only here; the backward owner updates and sends the weights back
            states += m.weights_bytes
            param_states += m.weights_bytes
        if i in stage.layers:
            stash += m.weights_bytes
            compute_copies += m.copy_bytes
    if role is not None:
        for segment in (role.before, role.after):
            if segment is not None:  # its saved activations, for one micro-batch, while its backward runs
                recompute = max(recompute, sum(layer_memory(model, i, LayerStrategy(), micro, config).saved_bytes
                                               for i in range(*segment)))
        if role.graph is None and role.before is not None and role.side_input is None and role.before[0] > 0:
            # the worker's own forward output, kept from its forward to its backward
            activations += in_flight_here * model.layers[role.before[0] - 1].output_bytes.at(micro) * \
                config.activation_scale
    last = model.n_layers - 1
    loss_gradients = loss_gradient_bytes(model, stage.strategy(last), micro) if last in stage.backward else 0.0
    stash_versions = plan.n_stages - stage_index - 1 if plan.schedule == "async-1f1b" else 0
    dynamic = activations + recompute  # scaled by activation_scale, which holds the allocator's share
    allocator = dynamic * config.allocator_fraction / (1.0 + config.allocator_fraction)
    return MemoryBreakdown(device=stage.devices[0], stage=stage_index, states_bytes=states,
                           activation_bytes=dynamic - allocator, stash_bytes=stash_versions * stash,
                           reserve_bytes=config.reserve_bytes, in_flight=in_flight_here,
                           allocator_bytes=allocator, tp_replicated_bytes=tp_replicated,
                           sdp_buffer_bytes=sdp_buffer_bytes(gathered, config),
                           ddp_bucket_bytes=ddp_grads * config.grad_bytes_per_param * config.ddp_bucket_fraction,
                           optimizer_step_bytes=optimizer_params * config.optimizer_step_bytes_per_param,
                           compute_copy_bytes=compute_copies, param_state_bytes=param_states, grad_bytes=grads,
                           optimizer_bytes=optimizer_states, recompute_bytes=recompute / (1.0 + config.allocator_fraction),
                           loss_gradient_bytes=loss_gradients, kept_weight_bytes=kept_weights,
                           kept_grad_bytes=kept_grads)


def loss_gradient_bytes(model: ModelSpec, strategy: LayerStrategy, micro_batch: float) -> float:
    """What the loss's backward adds at the stage holding the last layer (`micro_batch` entering
    its group): a gradient of each tensor the loss saved and the logits' own gradient
    (LayerSpec.loss_gradient_bytes), on one device of the group; 0 for a model measured without a loss."""
    head = model.layers[-1]
    if head.loss_gradient_bytes.per_sample <= 0 and head.loss_gradient_bytes.fixed <= 0:
        return 0.0
    local = micro_batch / strategy.data_degree
    return (head.loss_gradient_bytes.at(local) + head.output_grad_bytes.at(local)) / (strategy.tp * strategy.cp)


def tp_replicated_bytes(model: ModelSpec, index: int, strategy: LayerStrategy, micro_batch: float,
                        config: MemoryConfig) -> float:
    """Per micro-batch in flight: the part of layer `index`'s saved tensors that Megatron holds whole
    on every tp rank, beyond the 1/tp share costs/strategy.py counts (0 without tp)."""
    if strategy.tp <= 1 or strategy.checkpoint:
        return 0.0
    layer = model.layers[index]
    local = micro_batch / strategy.data_degree
    whole = min(layer.saved_bytes.at(local), config.tp_replicated_outputs * layer.output_bytes.at(local))
    # sequence parallelism splits the norms' inputs and the dropout masks along the sequence too
    # (Korthikanti et al. 2022 §4.2.2); the column-parallel linears' inputs stay whole as DTensor runs it
    share = config.sp_whole_share if strategy.sequence_parallel else 1.0
    return whole * share * (1.0 - 1.0 / strategy.tp) * config.activation_scale / strategy.cp


def sdp_buffer_bytes(gathered: list[float], config: MemoryConfig) -> float:
    """FSDP / ZeRO-3: `sdp_gathered_layers` largest unsharded layers' weights, and one unsharded
    gradient of the largest, from `gathered` (parameters per layer after tp)."""
    largest = sorted(gathered, reverse=True)
    # gathered in the compute dtype in mixed precision (FSDP2's MixedPrecisionPolicy(param_dtype))
    weights = sum(largest[:config.sdp_gathered_layers]) * gathered_bytes_per_param(config)
    return weights + largest[0] * config.grad_bytes_per_param


def gathered_bytes_per_param(config: MemoryConfig) -> float:
    """An all-gathered parameter's bytes: in the compute dtype in mixed precision (FSDP2's
    MixedPrecisionPolicy(param_dtype); an engine's 16-bit parameters), else as stored."""
    return config.gathered_bytes_per_param or config.compute_copy_bytes_per_param or config.param_bytes_per_param


def plan_memory(plan: Plan, model: ModelSpec, capacities: dict[int, int], config: MemoryConfig | None = None,
                device_kind: str | None = None, device_kinds: dict[int, str] | None = None,
                ) -> tuple[tuple[DeviceMemory, ...], tuple[MemoryBreakdown, ...]]:
    """Peak bytes of every device the plan uses (every device of a stage holds the same). The kind
    of a stage's devices (DeviceSpec.name: `device_kinds` per device id, else `device_kind` for all)
    decides the CUDA-only terms; unknown is treated as a CUDA device."""
    out, breakdowns = [], []
    for devices, b, each in rank_memory(plan, model, config, device_kind, device_kinds):
        # with shares each device holds its own share's activations (the table shows the largest's);
        # without, the rank's one peak summed once (not once a device: 1,024 at 1,024 GPUs)
        peak = None if each else int(round(b.peak_bytes))
        out.extend(DeviceMemory(device=d, peak_bytes=int(round(each[d].peak_bytes)) if each else peak,
                                capacity_bytes=capacities[d]) for d in (each or devices))
        breakdowns.append(b)
    return tuple(out), tuple(breakdowns)


def rank_memory(plan: Plan, model: ModelSpec, config: MemoryConfig | None = None, device_kind: str | None = None,
                device_kinds: dict[int, str] | None = None):
    """Per pipeline rank: (its devices, its breakdown, each device's where they hold shares, else None):
    one breakdown a rank, for a search that checks stages (not a row a device: 1,024 at 1,024 GPUs)."""
    ranks = plan.rank_of_stage
    for rank in range(plan.n_ranks):
        here = [s for s in range(plan.n_stages) if ranks[s] == rank]
        devices = plan.stages[here[0]].devices
        kind = device_kinds.get(devices[0], device_kind) if device_kinds else device_kind
        # a walk over the rank's order where its peak depends on the moment: several stages, a split
        # backward, or FSDP units kept per stage under pipelining (freed after the stage's last backward)
        walk = len(here) > 1 or plan.schedule in schedules.SPLIT_BACKWARD or _keeps_units(plan, config)
        if plan.stages[here[0]].shares:
            each = share_breakdowns(plan, model, here[0], config, device_kind, device_kinds)
            yield devices, max(each.values(), key=lambda b: b.activation_bytes), each
            continue
        yield devices, (_rank_memory(plan, model, rank, here, config, kind) if walk
                        else stage_memory(plan, model, here[0], config, kind)), None


def share_breakdowns(plan: Plan, model: ModelSpec, s: int, config=None, device_kind=None,
                     device_kinds=None) -> dict[int, MemoryBreakdown]:
    """Each device of a stage with shares at its own rows (the plan re-sized so that an equal split
    is that many rows), by device."""
    return {d: stage_memory(replace(plan, global_batch=(b - a) * len(plan.stages[s].devices) * plan.n_micro),
                            model, s, config, device_kinds.get(d, device_kind) if device_kinds else device_kind)
            for d, (a, b) in zip(plan.stages[s].devices, stage_rows(plan, s), strict=True)}


def _keeps_units(plan: Plan, config: MemoryConfig | None) -> bool:
    """Whether a pipelined plan keeps FSDP units per stage for its engine (MemoryConfig.pipeline_keeps_sdp_units)."""
    return (config is not None and config.pipeline_keeps_sdp_units and plan.n_ranks > 1
            and plan.kind is not PlanKind.BIPARTITION and plan.schedule in schedules.ORDERS
            and any(st.strategy(i).sdp > 1 for st in plan.stages for i in st.layers))


def _rank_memory(plan: Plan, model: ModelSpec, rank: int, stages: list[int], config: MemoryConfig | None,
                 device_kind: str | None) -> MemoryBreakdown:
    """A pipeline rank holding several stages (interleaved and V-shaped schedules), or running a
    split backward: the states of all its stages, and the activations at the moment of the rank's
    order when the micro-batches they hold weigh the most (plans/live_peak.py: live_peak; the
    stages' peaks need not coincide). A split backward (I, then W) keeps a micro-batch's saved
    tensors until its W, and from its I also the gradients its W starts from (torch's
    `stage_backward_input` retains the graph and those gradients: LayerSpec.weight_grad_input_bytes)."""
    config = (config or MemoryConfig()).for_device_kind(device_kind)
    here = frozenset(i for s in stages for i in plan.stages[s].layers)
    one = {s: stage_memory(plan, model, s, config, device_kind, 1, here) for s in stages}
    none = {s: stage_memory(plan, model, s, config, device_kind, 0, here) for s in stages}
    per_micro = {s: one[s].forward_peak_bytes - none[s].forward_peak_bytes for s in stages}
    micro = plan.global_batch / plan.n_micro
    for_weights = {s: sum(model.layers[i].weight_grad_input_bytes.at(micro / plan.stages[s].strategy(i).data_degree)
                          / (plan.stages[s].strategy(i).tp * plan.stages[s].strategy(i).cp)
                          for i in plan.stages[s].backward) * config.activation_scale
                   for s in stages} if plan.schedule in schedules.SPLIT_BACKWARD else {}
    order = schedules.rank_order(plan.schedule, plan.n_ranks, plan.virtual_stages, plan.n_micro, rank)
    peak = live_peak.live_peak(order, per_micro, for_weights,
                               {s: (one[s].kept_weight_bytes, one[s].kept_grad_bytes) for s in stages})
    held, waiting = peak.held, peak.waiting
    parts = [stage_memory(plan, model, s, config, device_kind, held[s], here) for s in stages]
    kept = sum(waiting[s] * for_weights.get(s, 0.0) for s in stages)  # the allocator's share included, as saved
    total = {f: sum(getattr(b, f) for b in parts) for f in (
        "states_bytes", "stash_bytes", "allocator_bytes", "tp_replicated_bytes", "ddp_bucket_bytes",
        "optimizer_step_bytes", "compute_copy_bytes", "param_state_bytes", "grad_bytes", "optimizer_bytes",
        "loss_gradient_bytes")}
    recompute = max(b.recompute_bytes for b in parts)  # one checkpointed layer recomputes at a time
    return MemoryBreakdown(device=parts[0].device, stage=stages[0], reserve_bytes=parts[0].reserve_bytes,
                           in_flight=sum(held.values()), recompute_bytes=recompute,
                           activation_bytes=sum(b.activation_bytes - b.recompute_bytes for b in parts) + recompute,
                           weight_pass_bytes=kept,
                           kept_weight_bytes=sum(b.kept_weight_bytes for b, s in zip(parts, stages, strict=True) if peak.units[s][0]),
                           kept_grad_bytes=sum(b.kept_grad_bytes for b, s in zip(parts, stages, strict=True) if peak.units[s][1]),
                           sdp_buffer_bytes=max(b.sdp_buffer_bytes for b in parts), **total)


def out_of_memory_reason(memory: tuple[DeviceMemory, ...]) -> str:
    """'' when everything fits, else the worst device and by how much."""
    over = [m for m in memory if not m.fits]
    if not over:
        return ""
    worst = max(over, key=lambda m: m.peak_bytes - m.capacity_bytes)
    extra = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    return (f"device {worst.device} out of memory by {(worst.peak_bytes - worst.capacity_bytes) / GIB:.2f} GiB: "
            f"needs {worst.peak_bytes / GIB:.2f} GiB of {worst.capacity_bytes / GIB:.2f} GiB{extra}")
