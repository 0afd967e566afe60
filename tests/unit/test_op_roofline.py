"""The per-operator cost model (issue 48, item 1): costs/op_roofline.py against rooflines computed by
hand on small shapes, and models/op_inventory.py's inventory of a real layer's kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from paraplan.costs.analytic import analytic_costs
from paraplan.costs.op_roofline import OperatorTime, gemm_seconds, pass_seconds
from paraplan.hardware import load_cluster
from paraplan.hardware.cluster import DeviceSpec, LinkSpec
from paraplan.hardware.cluster_file import ClusterFileError, cluster_from_dict
from paraplan.hardware.cluster_write import cluster_to_dict
from paraplan.models.attention_kernel import SdpaKernel
from paraplan.models.op_inventory import OpInventory, fit_pass
from paraplan.models.spec import Affine, Gemm, MemoryOp, PassOps

# 4 SMs, 2 x 2 tiles: a tile's 2 x 2 x K MACs at peak x MAMF / 4 per SM
GPU = DeviceSpec(name="g", peak_flops=1e12, memory_bandwidth_bytes_per_s=1e12, memory_bytes=2**30,
                 kernel_overhead_s=1e-13, max_efficiency=0.5, half_efficiency_flops=0.0, sm_count=4,
                 gemm_tile=(2, 2), attention_efficiency=0.25, memory_efficiency=0.5)
PER_SM = 1e12 * 0.5 / 4


def test_one_full_wave_is_the_mamf_roofline():
    # 4 x 4 output = 4 tiles = one wave of 4 SMs; compute 2 x 4 x 4 x 64 FLOPs at the MAMF
    t = gemm_seconds(1, 4, 4, 64, 2, GPU)
    assert t == pytest.approx(2 * 2 * 2 * 64 / PER_SM)
    assert t == pytest.approx(2 * 4 * 4 * 64 / (1e12 * 0.5))


def test_tile_and_wave_quantisation():
    full = gemm_seconds(1, 4, 4, 64, 2, GPU)
    # M = 5: ceil(5 / 2) x 2 = 6 tiles, two waves: twice the time for 25% more work
    assert gemm_seconds(1, 5, 4, 64, 2, GPU) == pytest.approx(2 * full)
    # 8 tiles fill two waves exactly; 9 need a third
    assert gemm_seconds(1, 8, 4, 64, 2, GPU) == pytest.approx(2 * full)
    assert gemm_seconds(1, 9, 4, 64, 2, GPU) == pytest.approx(3 * full)
    # batched: 2 products of 4 x 4 tiles each = 8 tiles = 2 waves
    assert gemm_seconds(2, 4, 4, 64, 2, GPU) == pytest.approx(2 * full)


def test_both_tile_orientations_are_tried():
    wide = DeviceSpec(**{**GPU.__dict__, "gemm_tile": (4, 1), "memory_bandwidth_bytes_per_s": 1e18})
    # M = 1, N = 4: 4 x 1 tiles along M waste 3 rows (ceil(1/4) x ceil(4/1) = 4 tiles); turned (1 x 4),
    # one tile covers it: 1 tile, one wave either way, but the second is what cuBLAS would run
    assert gemm_seconds(1, 1, 4, 8, 2, wide) == pytest.approx(2 * 4 * 1 * 8 / PER_SM)
    # 16 x 1: one orientation gives 4 tiles (1 wave), the other 16 (4 waves)
    assert gemm_seconds(1, 16, 1, 8, 2, wide) == pytest.approx(2 * 4 * 8 / PER_SM)


def test_a_skinny_gemm_is_memory_bound():
    # 1 x 4096 @ 4096 x 4 on a device of 1000x the compute: 2 x (4096 + 16384 + 4) bytes at 0.5 TB/s
    # take longer than its one wave
    fast = DeviceSpec(**{**GPU.__dict__, "peak_flops": 1e15})
    t = gemm_seconds(1, 1, 4, 4096, 2, fast)
    assert t == pytest.approx(2 * (4096 + 4096 * 4 + 4) / 0.5e12)
    assert t > 2 * 2 * 2 * 4096 / (1e15 * 0.5 / 4)


def test_launch_floor_and_empty_gemm():
    assert gemm_seconds(1, 2, 2, 1, 2, GPU) == pytest.approx(max(2 * 4 * 1 / PER_SM, GPU.kernel_overhead_s))
    assert gemm_seconds(1, 0, 4, 4, 2, GPU) == 0.0
    slow_launch = DeviceSpec(**{**GPU.__dict__, "kernel_overhead_s": 1.0})
    assert gemm_seconds(1, 4, 4, 64, 2, slow_launch) == 1.0


def test_a_pass_sums_its_kernels():
    ops = PassOps(gemms=(Gemm(Affine(1, 0), Affine(0, 4), Affine(4, 0), Affine(64, 0), 2, count=3),),
                  memory_ops=(MemoryOp(Affine(0, 1e6), count=2),),
                  attention_flops=Affine(0, 1e9), attention_bytes=Affine(0, 1e3), attention_kernels=1)
    b = 2.0
    gemm = gemm_seconds(1, 8, 4, 64, 2, GPU)  # M = 4 b = 8 rows
    memory = 2e6 / 0.5e12  # the datasheet bandwidth x memory_efficiency
    attention = 2e9 / (1e12 * 0.25)
    assert pass_seconds(ops, GPU, b) == pytest.approx(3 * gemm + 2 * memory + attention)
    # vectorised over micro-batch sizes as CSIMD's ODPA evaluates them
    many = OperatorTime(ops, GPU)(np.array([1.0, 2.0, 4.0]))
    assert many.shape == (3,) and many[1] == pytest.approx(OperatorTime(ops, GPU)(2.0))


def test_inventory_of_a_linear_layer_and_its_fit():
    layer = nn.Linear(16, 8, device="meta")
    entries = []
    for b in (2, 4):
        inventory = OpInventory()
        x = torch.empty(b, 5, 16, device="meta", requires_grad=True)
        with inventory:
            layer(x).sum().backward()
        entries.append(inventory.entries)
    ops = fit_pass(entries[0], entries[1], (2, 4))
    shapes = {(g.m.at(3), g.n.at(3), g.k.at(3)) for g in ops.gemms}
    # forward: (3 x 5 tokens) x 16 @ 16 x 8; backward: the input's gradient and the weight's
    assert (15, 8, 16) in shapes and (15, 16, 8) in shapes and (8, 16, 15) in shapes


def _attention_passes(is_causal_module: bool) -> tuple[list, list]:
    class Attention(nn.Module):
        is_causal = is_causal_module

        def forward(self, q):
            mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device)
            return nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    q = torch.empty(2, 4, 64, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
    forward, backward = OpInventory(), OpInventory()
    with SdpaKernel("fused"), forward:
        out = Attention()(q)
    with backward:
        out.sum().backward()
    return forward.entries, backward.entries


def test_fused_attention_counts_the_kernel_flash_runs():
    full = 4.0 * 2 * 4 * 64 * 64 * 32
    forward, backward = _attention_passes(False)
    assert [e[1] for e in forward if e[0] == "attention"] == [full]
    assert [e[1] for e in backward if e[0] == "attention"] == [2.5 * full]
    # no bmm of the kernel's own math is counted as a GEMM of its own
    assert not [e for e in forward if e[0] == "gemm"]
    # a decoder's attention runs causal on a GPU (transformers drops the mask): half the work
    forward, backward = _attention_passes(True)
    assert [e[1] for e in forward if e[0] == "attention"] == [full / 2]


def test_h100_llama_block_prices_between_the_rooflines():
    """A small Llama block on the H100 preset, priced kernel by kernel: its forward's FLOP rate stays
    under the MAMF ceiling (norms, residual adds and attention do not hide under the GEMMs' compute)."""
    from paraplan.workload import measured_model

    cluster = load_cluster("dgx-h100-80gb")
    device = cluster.device(0).for_precision("bf16")
    assert device.operator_priced
    _, spec = measured_model("hf:llama?hidden_size=1024&intermediate_size=3584&num_hidden_layers=1"
                             "&num_attention_heads=8&num_key_value_heads=2&vocab_size=1000&seq_len=1024",
                             precision="bf16", attention="fused")
    block = spec.layers[1]
    costs = analytic_costs(spec, device, LinkSpec(1e9, 0.0))
    forward = costs.forward[1](4)
    assert isinstance(costs.forward[1], OperatorTime)
    rate = block.forward_flops.at(4) / forward
    assert 0.1 * device.peak_flops < rate < device.peak_flops * device.max_efficiency
    # time per sample falls with the micro-batch and flattens (CSIMD Fig. 1's shape)
    per_sample = [costs.forward[1](b) / b for b in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a >= b for a, b in zip(per_sample, per_sample[1:], strict=False)) and per_sample[0] > per_sample[-1]
    assert math.isclose(per_sample[-1], per_sample[-2], rel_tol=0.1)


def test_cluster_file_operator_fields_go_together_and_round_trip():
    data = cluster_to_dict(load_cluster("dgx-h100-80gb"))
    again = cluster_from_dict(data, "x.toml")
    assert again.device(0).sm_count == 132 and again.device(0).gemm_tile == (256, 128)
    del data["device_types"]["h100-80gb"]["memory_efficiency"]
    with pytest.raises(ClusterFileError, match="memory_efficiency: missing"):
        cluster_from_dict(data, "x.toml")
