"""The DTensor parallel styles paraplan adds to torch's (runtime/layers/tensor_parallel.py uses them):
a lone Linear's column-parallel output gathered into a tensor of its own, Conv1D (transformers'
GPT-2 linear, weight stored (in, out)) column- and row-parallel, and a per-head table sharded on
its head dimension (Swin's relative position bias)."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel


class GatheredColwise(ColwiseParallel):
    """A lone Linear's column-parallel output, all-gathered into a tensor of its own: the gathered
    local view may not be modified in place, and a CNN's ReLU(inplace=True) follows it."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return ColwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh).clone()


class Conv1DColwise(ColwiseParallel):
    """ColwiseParallel for Conv1D, whose output columns are dim 1 of its (in, out) weight. The
    Conv1D stays (rather than a Linear with the weight transposed) so the parameter keeps its
    layout and path; its `addmm(bias, x, W)` runs on DTensors (x Replicate, W Shard(1), bias
    Shard(0) -> Shard(1)). `order` first permutes the output columns (GPT-2's fused QKV)."""

    def __init__(self, order: torch.Tensor | None = None):
        super().__init__()
        self.order = order

    def _partition(self, name, module, mesh):
        if name:  # distribute_module visits submodules too; Conv1D has none
            return
        weight, bias = module.weight.detach(), module.bias.detach()
        if self.order is not None:
            weight, bias = weight[:, self.order], bias[self.order]
            module._tp_column_order = self.order  # full_parameters undoes it
        for pname, value, placement in (("weight", weight, Shard(1)), ("bias", bias, Shard(0))):
            dt = distribute_tensor(value.contiguous(), mesh, [placement], src_data_rank=self.src_data_rank)
            grad = module._parameters[pname].requires_grad
            module.register_parameter(pname, nn.Parameter(dt, requires_grad=grad))

    def _apply(self, module, mesh):
        return distribute_conv1d(self, module, mesh)


class Conv1DRowwise(RowwiseParallel):
    """RowwiseParallel for Conv1D: input rows are dim 0 of its weight; the bias stays replicated
    (DTensor adds it once to the partial sums)."""

    def _partition(self, name, module, mesh):
        if name:
            return
        for pname, placement in (("weight", Shard(0)), ("bias", Replicate())):
            p = module._parameters[pname]
            dt = distribute_tensor(p.detach(), mesh, [placement], src_data_rank=self.src_data_rank)
            module.register_parameter(pname, nn.Parameter(dt, requires_grad=p.requires_grad))

    def _apply(self, module, mesh):
        self.desired_input_layouts = (Shard(-1),)
        return distribute_conv1d(self, module, mesh)


def distribute_conv1d(style, module, mesh):
    """What ColwiseParallel / RowwiseParallel._apply do, with our partition of a Conv1D."""
    prepare_input = partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts)
    prepare_output = partial(style._prepare_output_fn, style.output_layouts, style.use_local_output)
    return distribute_module(module, mesh, style._partition, prepare_input, prepare_output)


class HeadSharded(ParallelStyle):
    """Shards a per-head table (Swin's relative_position_bias_table, (positions, heads)) on its
    head dim and lets the module's own forward index the local shard: a pre-hook shadows the
    parameter with `to_local()` in the instance __dict__ (found before nn.Module.__getattr__), so
    the gradient flows back into the DTensor. (Indexing the DTensor with a plain index tensor
    would mix DTensor and Tensor, which DTensor refuses.)"""

    def __init__(self, name: str, dim: int):
        super().__init__()
        self.name, self.dim = name, dim

    def _apply(self, module, mesh):
        p = module._parameters[self.name]
        dt = distribute_tensor(p.detach(), mesh, [Shard(self.dim)], src_data_rank=self.src_data_rank)
        module._parameters[self.name] = nn.Parameter(dt, requires_grad=p.requires_grad)
        module.register_forward_pre_hook(self._shadow)
        module.register_forward_hook(self._unshadow)
        return module

    def _shadow(self, mod, args) -> None:
        mod.__dict__[self.name] = mod._parameters[self.name].to_local()

    def _unshadow(self, mod, args, out) -> None:  # returns None: the output stays the module's
        mod.__dict__.pop(self.name, None)
