"""ZeRO-1/2's optimizer state in a checkpoint keyed by parameter name (issue 53 item 1).

Under ZeRO-1/2 (runtime/layers/zero.py) the optimizer steps views of each replica's owned ranges of
the group's flattened parameters, so Adam's moments exist per view, not per parameter, and no
replica holds a whole parameter's state. A checkpoint keyed by the model's parameter names (runtime/
state/layout_state.py) needs each parameter's whole state: `gathered` all-gathers the owned ranges
over the dp group (the step's own all-gather, for the moments instead of the weights) and gives every
replica each parameter's state in its shape (a DTensor where the parameter is one); `targets` makes
the tensors a load fills and `scatter` hands each replica its owned ranges of them. Any plan can then
resume the state: another dp degree, no ZeRO, or ZeRO over other groups. The ZeroSync objects come
from the rank (runtime/layers/zero.py); this module reads their groups, offsets and owned ranges.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor (runtime/measure/memory_meter.py's, which state/ may
    not import: tests/unit/test_runtime_layers.py)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _flat_local(t: torch.Tensor) -> torch.Tensor:
    return local_value(t.detach()).reshape(-1)


def _shaped_like(local: torch.Tensor, param) -> torch.Tensor:
    """`local` (the parameter's local values) as the parameter is: a DTensor on its mesh, or plain."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False)
    return local


def _keys(z, optim) -> tuple[list[str], bool]:
    """The state keys of a ZeroSync's views (the moments), and whether it has a step count."""
    tensors, step = [], False
    for view in z.views:
        for key, value in optim.state.get(view, {}).items():
            if key == "step":
                step = True
            elif isinstance(value, torch.Tensor) and value.dim() and key not in tensors:
                tensors.append(key)
    return tensors, step


def gathered(zero_syncs, optim) -> dict[int, dict[str, torch.Tensor]]:
    """Collective over each ZeroSync's group: id(parameter) -> {state key: the whole parameter's
    state}, for every parameter under ZeRO that has optimizer state (none before the first step)."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for z in zero_syncs:
        keys, has_step = _keys(z, optim)
        # every replica of the group must take part in the same all-gathers: agree on the keys
        flags = torch.tensor([float(bool(keys)), float(has_step)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=z.group)
        if not flags[0]:
            continue
        dtype = local_value(z.params[0].detach()).dtype
        # the same keys, in the same order, on every replica: one optimizer class, and every replica
        # owns some of the group's elements (the chunks are 1/dp of them)
        for key in keys:
            owned = [optim.state[v][key].reshape(-1) for v in z.views if key in optim.state.get(v, {})]
            mine = torch.zeros(z.chunk, dtype=dtype)
            if owned:
                flat = torch.cat(owned)
                mine[:flat.numel()] = flat
            everything = torch.empty(z.chunk * z.size, dtype=dtype)
            dist.all_gather_single(everything, mine, group=z.group)
            for i, p in enumerate(z.params):
                local = everything[z.offsets[i]:z.offsets[i + 1]].view_as(local_value(p.detach())).clone()
                out.setdefault(id(p), {})[key] = _shaped_like(local, p)
        if flags[1]:
            step = max((float(optim.state[v]["step"]) for v in z.views if "step" in optim.state.get(v, {})),
                       default=0.0)
            count = torch.tensor([step])
            dist.all_reduce(count, op=dist.ReduceOp.MAX, group=z.group)
            for p in z.params:
                out.setdefault(id(p), {})["step"] = count[0].clone()
    return out


def targets(zero_syncs, optim) -> dict[int, dict[str, torch.Tensor]]:
    """id(parameter) -> {state key: a tensor of the parameter's shape (or a scalar step) for a load to
    fill}, with the keys its views' state has (runtime/state/layout_state.py: init_optimizer_state
    gave every view its state first)."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for z in zero_syncs:
        keys, has_step = _keys(z, optim)
        for p in z.params:
            state = {key: _shaped_like(torch.zeros_like(local_value(p.detach())), p) for key in keys}
            if has_step:
                state["step"] = torch.zeros(())
            if state:
                out[id(p)] = state
    return out


def scatter(zero_syncs, optim, loaded: dict[int, dict[str, torch.Tensor]], dropped: set[int]) -> None:
    """Each replica's owned ranges of the loaded whole states into its views' optimizer state; a
    parameter in `dropped` (saved without optimizer state) leaves its views without any."""
    for z in zero_syncs:
        for view, (i, a, b) in zip(z.views, z.owned, strict=True):
            p = z.params[i]
            if id(p) in dropped:
                optim.state.pop(view, None)
                continue
            state = loaded.get(id(p))
            if not state:
                continue
            for key, value in state.items():
                if key == "step":
                    optim.state[view][key] = value.clone().reshape(optim.state[view][key].shape)
                else:
                    optim.state[view][key].copy_(_flat_local(value)[a:b])
