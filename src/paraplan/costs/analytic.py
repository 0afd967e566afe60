"""Analytic per-layer costs from a measured ModelSpec and a device model.

On a GPU described down to its SMs a layer's passes are priced kernel by kernel (costs/
op_roofline.py, from the kernels the measurement inventoried); elsewhere by the layer roofline below.

The FLOPs, bytes and kernel counts come from the meta-device measurement; the device model turns
them into seconds (costs/timefn.py). Memory traffic is a rough count of what each pass must move
through device memory at least once:
    forward:  parameters (none for a lookup) + input + output + saved tensors
    backward: parameters read and gradients written + saved tensors + input + two output gradients
"""

from __future__ import annotations

from paraplan.costs.op_roofline import OperatorTime
from paraplan.costs.timefn import ComputeTime, LayerCosts, TransferTime
from paraplan.hardware.cluster import DeviceSpec, LinkSpec
from paraplan.models.spec import Affine, ModelSpec


def _plus(*terms: Affine) -> Affine:
    return Affine(fixed=sum(t.fixed for t in terms), per_sample=sum(t.per_sample for t in terms))


def analytic_costs(model: ModelSpec, device: DeviceSpec, link: LinkSpec) -> LayerCosts:
    forward, backward, send_f, send_b = [], [], [], []
    previous_output = model.input_bytes
    for layer in model.layers:
        params = Affine(fixed=layer.param_bytes + layer.shared_param_bytes, per_sample=0.0)
        # An embedding lookup (no FLOPs) reads only the rows it gathers, not its whole table.
        fwd_params = params if layer.forward_flops.per_sample > 0 else Affine(0.0, 0.0)
        fwd_traffic = _plus(fwd_params, previous_output, layer.output_bytes, layer.saved_bytes)
        bwd_traffic = _plus(params, params, layer.saved_bytes, previous_output, layer.output_grad_bytes,
                            layer.output_grad_bytes)
        if device.operator_priced and layer.forward_inventory is not None and layer.backward_inventory is not None:
            # a GPU described down to its SMs: kernel by kernel (costs/op_roofline.py)
            forward.append(OperatorTime(layer.forward_inventory, device))
            backward.append(OperatorTime(layer.backward_inventory, device))
        else:
            forward.append(ComputeTime(layer.forward_flops, fwd_traffic, max(1, layer.forward_ops), device))
            backward.append(ComputeTime(layer.backward_flops, bwd_traffic, max(1, layer.backward_ops), device))
        send_f.append(TransferTime(layer.output_bytes, link))
        send_b.append(TransferTime(layer.output_grad_bytes, link))
        previous_output = layer.output_bytes
    return LayerCosts(forward=tuple(forward), backward=tuple(backward), send_forward=tuple(send_f),
                      send_backward=tuple(send_b), source=f"analytic:{device.name}")
