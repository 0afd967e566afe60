"""Analytic time functions: nonlinear in batch, exact transfer formula, vectorised."""

import numpy as np
import pytest

from paraplan.costs.analytic import analytic_costs
from paraplan.costs.timefn import ComputeTime, TransferTime
from paraplan.hardware import load_cluster
from paraplan.hardware.cluster import DeviceSpec, LinkSpec
from paraplan.models import measure, zoo
from paraplan.models.spec import Affine

DEVICE = DeviceSpec(name="d", peak_flops=10e12, memory_bandwidth_bytes_per_s=1e12, memory_bytes=16 * 2**30,
                    kernel_overhead_s=1e-5, max_efficiency=0.5, half_efficiency_flops=1e8)


def test_compute_time_closed_form():
    t = ComputeTime(flops=Affine(0, 1e9), memory_bytes=Affine(0, 1e3), n_ops=10, device=DEVICE)
    # compute-bound: 10 kernels x 10 us + (b*1e9 + 10*1e8) / (10e12 * 0.5)
    assert t(4) == pytest.approx(10 * 1e-5 + (4e9 + 1e9) / 5e12)


def test_time_per_sample_falls_with_batch_then_flattens():
    t = ComputeTime(flops=Affine(0, 1e8), memory_bytes=Affine(1e8, 1e6), n_ops=20, device=DEVICE)
    sizes = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    per_sample = t(sizes) / sizes
    assert np.all(np.diff(per_sample) < 0)
    assert per_sample[0] / per_sample[-1] > 2  # strongly nonlinear at small batch (CSIMD Fig. 1)
    assert per_sample[-2] / per_sample[-1] < 1.2  # nearly linear at large batch


def test_vectorised_equals_scalar():
    t = ComputeTime(flops=Affine(5e6, 1e8), memory_bytes=Affine(1e8, 1e6), n_ops=7, device=DEVICE)
    sizes = np.array([1.0, 3.0, 17.0])
    assert np.allclose(t(sizes), [t(float(b)) for b in sizes])


def test_transfer_time_is_alpha_plus_bytes_over_beta():
    link = LinkSpec(bandwidth_bytes_per_s=1e9, latency_s=1e-4)
    t = TransferTime(nbytes=Affine(0, 4096), link=link)
    assert t(8) == pytest.approx(1e-4 + 8 * 4096 / 1e9)
    assert TransferTime(nbytes=Affine(0, 0), link=link)(8) == 0.0


def test_analytic_costs_of_a_model():
    cluster = load_cluster("csimd-v100-10gbe")
    spec = measure.measure(zoo.build("gpt2-tiny"))
    costs = analytic_costs(spec, cluster.device(0), cluster.link(0, 1))
    fwd, bwd, send_f, send_b = costs.arrays(8)
    assert costs.n_layers == spec.n_layers == 6
    assert np.all(fwd > 0) and np.all(bwd > 0)
    # identical blocks cost the same; backward costs more than forward for blocks
    assert np.allclose(fwd[1:5], fwd[1]) and np.all(bwd[1:5] > fwd[1:5])
    # a block's output: 8 samples x 32 tokens x 64 floats over 10 GbE
    assert send_f[1] == pytest.approx(cluster.link(0, 1).latency_s + 8 * 32 * 64 * 4 / 1.175e9)
    # a device with a lower peak is slower once the work is large enough to be compute-bound
    slow = analytic_costs(spec, load_cluster("gropipe-8xt4").device(0), cluster.link(0, 1))
    assert slow.arrays(4096)[0][1] > 1.3 * costs.arrays(4096)[0][1]
