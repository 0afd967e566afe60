"""The NASNet-A-like model (models/nasnet.py) and its zoo entries nasnet-large / nasnet-tiny."""

import os

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from paraplan.models import measure, zoo
from paraplan.models.adapters import decompose
from paraplan.models.inputs import make_batch
from paraplan.models.nasnet import nasnet
from paraplan.models.op_trace import build_op_graph

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_published_sizes():
    """NASNet-A large (6 @ 4032, 331x331, ImageNet stem) has 88.9M parameters, NASNet-A mobile
    (4 @ 1056) 5.3M (Zoph et al. 2018, Table 2)."""
    with torch.device("meta"):
        large = nasnet(6, 168, num_classes=1000, image_size=331)
        mobile = nasnet(4, 44, num_classes=1000, image_size=224)
    assert abs(sum(p.numel() for p in large.parameters()) - 88.9e6) / 88.9e6 < 0.01
    assert abs(sum(p.numel() for p in mobile.parameters()) - 5.3e6) / 5.3e6 < 0.01
    x = torch.empty(2, 3, 331, 331, device="meta")
    shapes = {}
    for name, layer in large.named_children():
        x = layer(x)
        shapes[name] = tuple(x[1].shape) if isinstance(x, tuple) else tuple(x.shape)
    assert shapes["cell0"] == (2, 1008, 42, 42) and shapes["cell6"] == (2, 2016, 21, 21)
    assert shapes["cell17"] == (2, 4032, 11, 11) and shapes["head"] == (2, 1000)


def test_zoo_entries():
    large = zoo.build("nasnet-large")
    names = [name for name, _, _ in decompose(large.module, large.family)]
    assert names == (["stem"] + [f"cell{i}" for i in range(6)] + ["reduction0"] + [f"cell{i}" for i in range(6, 12)]
                     + ["reduction1"] + [f"cell{i}" for i in range(12, 18)] + ["head"])
    assert large.inputs.image_size == 32 and large.inputs.num_classes == 10
    assert zoo.entry("nasnet-tiny").tiny and not zoo.entry("nasnet-large").tiny
    # a 331x331 image switches to the ImageNet stem and its two stem reduction cells
    assert [n for n, _ in zoo.build("nasnet-large", image_size=331).module.named_children()][:3] == [
        "stem", "stem_cell0", "stem_cell1"]


@pytest.fixture
def one_thread():
    """Tiny depthwise convs on a shared 2-core machine: one thread is 20x faster than two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_runs_on_cpu_and_its_layers_compose_back(one_thread):
    built = zoo.build("nasnet-tiny", device="cpu", seed=0)
    built.module.eval()
    x, _ = make_batch(built.inputs, 3, seed=1)
    with torch.no_grad():
        expected = built.module(x)
        h = x
        for _, _, layer in built.layers():
            h = layer(h)
    assert expected.shape == (3, 10)
    torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-5)
    # one training step runs (backward through every cell)
    built.module.train()
    x, y = make_batch(built.inputs, 2, seed=2)
    built.loss(built.module(x), y).backward()
    assert all(p.grad is not None for p in built.module.parameters())


def test_tiny_measures_and_its_op_graph_builds():
    built = zoo.build("nasnet-tiny")
    spec = measure.measure(built)
    assert spec.n_layers == 7 and spec.param_count == sum(p.numel() for p in built.module.parameters())
    graph = build_op_graph(built)
    assert all(e.src < e.dst for e in graph.edges)
    forward = [n for n in graph.nodes if n.phase == "forward"]
    backward = [n for n in graph.nodes if n.phase == "backward"]
    assert len(forward) > 300 and len(backward) > 250
    convs = [n for n in forward if n.op == "convolution"]
    assert convs and all(n.splittable == "batch" for n in convs)
    # the graph's forward FLOPs equal FlopCounterMode's on the real forward
    x, _ = built.batch(4, device="meta")
    with FlopCounterMode(display=False) as counter:
        built.module(x)
    assert sum(n.flops.at(4) for n in forward if n.layer >= 0) == pytest.approx(counter.get_total_flops(), rel=1e-6)
