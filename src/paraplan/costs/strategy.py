"""One layer's time and memory under a `LayerStrategy` (dp / sdp / tp degrees, checkpointing).

The one place that prices a layer's strategy: the simulator's stages (simulate/plan_work.py), the
memory model (costs/memory.py) and the planners' memory checks (Bi-Partition) all call it, so they
cannot disagree; Galvatron-BMW's dynamic program will read the same numbers as `[layer, strategy]`
arrays (`strategy_arrays`).

Time (Galvatron-BMW §V, on one device of the group, at the stage's micro-batch size b):
  compute      forward(b / (dp x sdp)) / tp and backward(...) / tp (Megatron splits a layer's
               matrix products tp ways);
  tp           two all-reduces of the layer's activations per pass (Megatron: one after the
               attention, one after the MLP), ring over the tp group;
  sdp          ZeRO-3 / FSDP: an all-gather of the layer's parameter shard before each pass and a
               reduce-scatter of its gradients after the backward, over the data group;
  checkpoint   the forward runs again inside the backward;
  dp           the gradient all-reduce is not in the layer's time: it is the stage's sync, issued
               by the schedule (`grad_allreduce_bytes`).
Memory per device:
  states       params x state_bytes_per_param / (tp x sdp)  (fp32 Adam: 16 bytes per parameter);
  weights      params x param_bytes_per_param / (tp x sdp)  (a weight copy: stash, or Bi-Partition's
               forward-only owner, which keeps only the latest weights);
  saved        what one micro-batch in flight keeps for the backward: the layer's saved tensors at the
               local batch, / tp; a checkpointed layer keeps only its input;
  recompute    a checkpointed layer's full saved set, alive while it recomputes (one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.costs.collectives import ring_allgather_s, ring_allreduce_s, ring_reducescatter_s
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.timefn import LayerCosts
from paraplan.hardware.cluster import LinkSpec
from paraplan.models.spec import ModelSpec
from paraplan.plan.plan import LayerStrategy


@dataclass(frozen=True)
class LayerTime:
    forward_s: float
    backward_s: float  # with recomputation, tp all-reduces and sdp collectives
    grad_allreduce_bytes: float  # the dp all-reduce this layer adds to its stage's sync (0 without dp)


@dataclass(frozen=True)
class LayerMemory:
    states_bytes: float
    weights_bytes: float
    saved_bytes: float  # per micro-batch in flight
    recompute_bytes: float


def param_count(model: ModelSpec, index: int, tied_copy: bool) -> float:
    """Parameters a holder of layer `index` keeps; a tied weight owned by a layer elsewhere is a
    second copy on this holder (GPT-2's head) when `tied_copy`."""
    layer = model.layers[index]
    extra = layer.shared_param_bytes if tied_copy else 0
    return (layer.param_bytes + extra) / model.dtype_bytes


def layer_memory(model: ModelSpec, index: int, strategy: LayerStrategy, micro_batch: float,
                 config: MemoryConfig, tied_copy: bool = False) -> LayerMemory:
    """Memory of layer `index` on one device of its group; `micro_batch` is the batch entering the group."""
    layer = model.layers[index]
    params = param_count(model, index, tied_copy)
    shards = strategy.tp * strategy.sdp
    local = micro_batch / strategy.data_degree
    saved = layer.saved_bytes.at(local) * config.activation_scale / strategy.tp
    recompute = 0.0
    if strategy.checkpoint:
        previous = model.layers[index - 1].output_bytes if index > 0 else model.input_bytes
        saved, recompute = previous.at(local) * config.activation_scale / strategy.tp, saved
    return LayerMemory(states_bytes=params * config.state_bytes_per_param / shards,
                       weights_bytes=params * config.param_bytes_per_param / shards,
                       saved_bytes=saved, recompute_bytes=recompute)


def layer_time(costs: LayerCosts, model: ModelSpec, index: int, strategy: LayerStrategy, micro_batch: float,
               tp_link: LinkSpec, data_link: LinkSpec) -> LayerTime:
    """Time of layer `index` on one device of its group (Galvatron-BMW §V)."""
    layer = model.layers[index]
    local = micro_batch / strategy.data_degree
    tp, sdp = strategy.tp, strategy.sdp
    forward = float(costs.forward[index](local)) / tp
    backward = float(costs.backward[index](local)) / tp
    if tp > 1:  # Megatron: two all-reduces of the activations per pass
        forward += 2 * ring_allreduce_s(layer.output_bytes.at(local), tp, tp_link)
        backward += 2 * ring_allreduce_s(layer.output_grad_bytes.at(local), tp, tp_link)
    shard = layer.param_bytes / tp
    if sdp > 1:  # ZeRO-3: gather the weights for each pass, scatter the gradients after the backward
        gather = ring_allgather_s(shard, sdp, data_link)
        forward += gather
        backward += gather + ring_reducescatter_s(shard, sdp, data_link)
    if strategy.checkpoint:
        backward += forward
    return LayerTime(forward_s=forward, backward_s=backward,
                     grad_allreduce_bytes=shard / sdp if strategy.dp > 1 else 0.0)


def strategy_arrays(costs: LayerCosts, model: ModelSpec, strategies: tuple[LayerStrategy, ...], micro_batch: float,
                    tp_link: LinkSpec, data_link: LinkSpec, config: MemoryConfig) -> dict[str, np.ndarray]:
    """Every layer under every strategy: arrays of shape [layer, strategy] for a dynamic program
    (Galvatron-BMW's): forward_s, backward_s, states_bytes, saved_bytes, recompute_bytes."""
    n, s = model.n_layers, len(strategies)
    out = {key: np.zeros((n, s)) for key in ("forward_s", "backward_s", "states_bytes", "saved_bytes",
                                              "recompute_bytes")}
    for i in range(n):
        for j, st in enumerate(strategies):
            t = layer_time(costs, model, i, st, micro_batch, tp_link, data_link)
            m = layer_memory(model, i, st, micro_batch, config)
            out["forward_s"][i, j], out["backward_s"][i, j] = t.forward_s, t.backward_s
            out["states_bytes"][i, j], out["saved_bytes"][i, j] = m.states_bytes, m.saved_bytes
            out["recompute_bytes"][i, j] = m.recompute_bytes
    return out
