"""The operator DAG of a training iteration (models/op_trace.py) and its batch split (models/op_split.py)."""

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from paraplan.errors import ParaplanError
from paraplan.models import source
from paraplan.models.built import BuiltModel
from paraplan.models.op_split import split_candidates, split_operators
from paraplan.models.op_trace import build_op_graph, operator_calls
from paraplan.models.spec import InputSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _meta_built(module: nn.Module, name: str, image: int, channels: int, classes: int) -> BuiltModel:
    return BuiltModel(name, "sequential", module.to("meta"), InputSpec(kind="image", image_size=image,
                                                                       channels=channels, num_classes=classes))


def mlp() -> BuiltModel:
    return _meta_built(nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)), "mlp", 2, 3, 3)


def convnet() -> BuiltModel:
    return _meta_built(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)), "convnet", 8, 3, 3)


@pytest.fixture(scope="module")
def gpt2():
    return source.build("gpt2-tiny", device="meta")


@pytest.fixture(scope="module")
def gpt2_graph(gpt2):
    return build_op_graph(gpt2)


def _iteration(built: BuiltModel, batch: int, mode=None):
    """A plain forward + loss on meta (under `mode` if given); returns the loss."""
    built.module.train()
    x, y = built.batch(batch, device="meta")
    out = x
    with mode if mode is not None else contextlib.nullcontext():
        for _, _, layer in built.layers():
            out = layer(out)
        loss = built.loss(out, y)
    return loss


def _autograd_nodes(loss) -> int:
    """Distinct autograd Nodes reachable from the loss, AccumulateGrad excluded (as op_trace)."""
    seen, stack, count = set(), [loss.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if not node.name().endswith("AccumulateGrad"):
            count += 1
        stack.extend(fn for fn, _ in node.next_functions)
    return count


class _ComputeCounter(TorchDispatchMode):
    """Counts aten ops that compute: no view (schema or shared storage), no empty/detach/lift."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if func.is_view or name in ("empty", "empty_like", "empty_strided", "detach", "alias", "lift_fresh"):
            return out
        ins = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        if outs and not func._schema.is_mutable and all(o.untyped_storage()._cdata in ins for o in outs):
            return out
        self.ops.append(name)
        return out


def _phase(graph, phase):
    return [n for n in graph.nodes if n.phase == phase]


# ---------------------------------------------------------------------------------------------- (a) counts
def test_mlp_by_hand():
    g = build_op_graph(mlp())
    fwd = _phase(g, "forward")
    assert [n.op for n in fwd] == ["addmm", "relu", "addmm", "_log_softmax", "nll_loss_forward"]
    # NllLoss, LogSoftmax, the loss's reshape (View), Addmm, T (weight), Relu, Addmm, T
    assert len(_phase(g, "backward")) == 8
    fc1 = g.nodes[g.index()["fwd:1:addmm"]]
    assert fc1.flops.per_sample == 2 * 12 * 8 and fc1.flops.fixed == 0
    assert fc1.param_bytes == (12 * 8 + 8) * 4 and fc1.output_bytes.per_sample == 8 * 4
    # the weight's gradient is charged to AddmmBackward, not to the TBackward that passes it on
    bwd_fc1 = g.nodes[g.index()["bwd:1:addmm_backward"]]
    assert bwd_fc1.param_bytes == (12 * 8 + 8) * 4
    assert sum(n.param_bytes for n in _phase(g, "backward")) == (12 * 8 + 8 + 8 * 3 + 3) * 4
    edge = {(g.nodes[e.src].name, g.nodes[e.dst].name): e.nbytes for e in g.edges}
    assert edge[("fwd:1:addmm", "fwd:2:relu")].per_sample == 8 * 4
    assert ("fwd:2:relu", "bwd:2:relu_backward") in edge  # relu keeps its output for the backward
    assert fc1.splittable == ""  # one row per sample: the parameter-heavy FC is not split


@pytest.mark.parametrize("make", [mlp, convnet])
def test_node_counts_match_autograd_and_dispatch(make):
    built = make()
    g = build_op_graph(built)
    assert len(_phase(g, "backward")) == _autograd_nodes(_iteration(built, 2))
    counter = _ComputeCounter()
    _iteration(built, 2, counter)
    assert [n.op for n in _phase(g, "forward")] == counter.ops


def test_gpt2_counts_match_autograd_and_dispatch(gpt2, gpt2_graph):
    assert len(_phase(gpt2_graph, "backward")) == _autograd_nodes(_iteration(gpt2, 2))
    counter = _ComputeCounter()
    _iteration(gpt2, 2, counter)
    assert len(_phase(gpt2_graph, "forward")) == len(counter.ops)
    assert {n.layer for n in gpt2_graph.nodes} == set(range(-1, len(gpt2.layers())))


# ------------------------------------------------------------------------------------- (b) names, (c) order
def test_names_are_stable_and_unique(gpt2_graph):
    again = build_op_graph(source.build("gpt2-tiny", device="meta"))
    assert again == gpt2_graph
    names = [n.name for n in gpt2_graph.nodes]
    assert len(set(names)) == len(names)
    assert "fwd:transformer.h.0.attn.c_attn:addmm" in names and "bwd:transformer.h.0.attn.c_attn:addmm_backward" in names
    assert "fwd:transformer.h.0.mlp.act:mul#1" in names


def test_topological_order(gpt2_graph):
    assert all(e.src < e.dst for e in gpt2_graph.edges)
    phases = [n.phase for n in gpt2_graph.nodes]
    assert phases == sorted(phases, key=lambda p: p == "backward")  # the forward first


# ---------------------------------------------------------------------------------------------- (d) FLOPs
@pytest.mark.parametrize("make", [mlp, convnet, None])
def test_flops_equal_flop_counter_mode(make, gpt2, gpt2_graph):
    built, g = (gpt2, gpt2_graph) if make is None else (make(), None)
    g = g or build_op_graph(built)
    with FlopCounterMode(display=False) as fwd:
        loss = _iteration(built, 3)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    assert sum(n.flops.at(3) for n in _phase(g, "forward")) == fwd.get_total_flops()
    assert sum(n.flops.at(3) for n in _phase(g, "backward")) == bwd.get_total_flops()


# ---------------------------------------------------------------------------------------------- (e) affine
@pytest.mark.parametrize("make", [convnet, None])
def test_affine_values_predict_a_third_batch(make, gpt2, gpt2_graph):
    built, g = (gpt2, gpt2_graph) if make is None else (make(), None)
    g = g or build_op_graph(built)
    direct = build_op_graph(built, batches=(3, 5))
    assert [n.name for n in direct.nodes] == [n.name for n in g.nodes]
    for a, b in zip(g.nodes, direct.nodes, strict=True):
        for field in ("flops", "bytes_accessed", "output_bytes"):
            assert getattr(a, field).at(3) == pytest.approx(getattr(b, field).at(3)), (a.name, field)
        assert (a.param_bytes, a.splittable) == (b.param_bytes, b.splittable)
    assert [(e.src, e.dst) for e in g.edges] == [(e.src, e.dst) for e in direct.edges]
    for a, b in zip(g.edges, direct.edges, strict=True):
        assert a.nbytes.at(3) == pytest.approx(b.nbytes.at(3))


class _BatchDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        x = self.fc(x.flatten(1))
        return x * 2 if x.shape[0] > 2 else x


def test_a_graph_that_changes_with_the_batch_is_an_error():
    built = _meta_built(nn.Sequential(_BatchDependent()), "odd", 2, 3, 3)
    with pytest.raises(ParaplanError, match="changes between batch 2 and 4"):
        build_op_graph(built)


# ------------------------------------------------------------------------------------------- (f) splitting
def test_split_keeps_flops_order_and_names(gpt2_graph):
    g = gpt2_graph
    chosen = split_candidates(g, 8)
    assert chosen and all(g.nodes[i].splittable == "batch" for i in chosen)
    s = split_operators(g, 4, batch=8)
    assert all(e.src < e.dst for e in s.edges)
    assert s.n_nodes == g.n_nodes + 4 * len(chosen)  # d parts + a gather instead of each
    gathers = [n for n in s.nodes if n.name.endswith("/gather")]
    extra = sum(n.flops.at(8) for n in gathers) + sum(3 * g.nodes[i].flops.fixed for i in chosen)
    assert sum(n.flops.at(8) for n in s.nodes) == pytest.approx(sum(n.flops.at(8) for n in g.nodes) + extra)
    index = s.index()
    name = g.nodes[chosen[0]].name
    assert [f"{name}/part{k}" in index for k in range(4)] == [True] * 4
    # consumers read from the gather; each part reads its share of the batch
    consumers = {s.nodes[e.dst].name for e in s.edges if e.src == index[f"{name}/gather"]}
    originals = {g.nodes[e.dst].name for e in g.edges if e.src == chosen[0]}
    assert {c.split("/")[0] for c in consumers} == originals
    part_in = [e for e in s.edges if e.dst == index[f"{name}/part0"]]
    orig_in = [e for e in g.edges if e.dst == chosen[0]]
    assert sum(e.nbytes.per_sample for e in part_in) == pytest.approx(sum(e.nbytes.per_sample for e in orig_in) / 4)
    assert split_operators(g, 4, batch=1) is g  # one sample: nothing to cut
    again = split_operators(s, 4, batch=8, min_share=0.0)
    assert not any(n.name.count("/") > 1 for n in again.nodes)  # parts and gathers are not split again


def test_named_splits_make_exactly_those(gpt2_graph):
    name = "fwd:transformer.h.0.attn.c_attn:addmm"
    s = split_operators(gpt2_graph, {name: 3})
    assert s.n_nodes == gpt2_graph.n_nodes + 3
    assert [n.name for n in s.nodes if n.name.startswith(name)] == [f"{name}/part{k}" for k in range(3)] + [
        f"{name}/gather"]
    assert s.nodes[s.index()[f"{name}/part1"]].flops.per_sample == gpt2_graph.nodes[gpt2_graph.index()[name]].flops.per_sample / 3
    with pytest.raises(ParaplanError, match="no operator"):
        split_operators(gpt2_graph, {"fwd:nowhere:mm": 2})
    with pytest.raises(ParaplanError, match="cannot be split"):
        split_operators(gpt2_graph, {"fwd:transformer.h.0.ln_1:native_layer_norm": 2})


def test_split_rule_on_a_cnn():
    g = build_op_graph(source.build("vgg-tiny", device="meta"))
    kinds = {(n.op, n.splittable) for n in g.nodes if n.op in ("convolution", "convolution_backward", "addmm")}
    assert ("convolution", "batch") in kinds and ("convolution_backward", "batch") in kinds
    assert ("addmm", "") in kinds and ("addmm", "batch") not in kinds  # the classifier's FC is not split


# ------------------------------------------------------------------------------------ (g) numbers on a CPU
def test_batch_split_conv_equals_the_unsplit_conv_forward_and_backward():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 8, 8, generator=gen, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, generator=gen, requires_grad=True)
    b = torch.randn(5, generator=gen, requires_grad=True)
    grad = torch.randn(4, 5, 8, 8, generator=gen)
    full = F.conv2d(x, w, b, padding=1)
    full_gx, full_gw, full_gb = torch.autograd.grad(full, (x, w, b), grad)
    outs, gxs, gws, gbs = [], [], [], []
    for xs, gs in zip(x.detach().chunk(2), grad.chunk(2), strict=True):
        xs.requires_grad_(True)
        part = F.conv2d(xs, w, b, padding=1)
        outs.append(part)
        gx, gw, gb = torch.autograd.grad(part, (xs, w, b), gs)
        gxs.append(gx), gws.append(gw), gbs.append(gb)
    torch.testing.assert_close(torch.cat(outs), full)  # the gather: concatenation
    torch.testing.assert_close(torch.cat(gxs), full_gx)
    torch.testing.assert_close(sum(gws), full_gw)  # and the sum of the weight-gradient partials
    torch.testing.assert_close(sum(gbs), full_gb)


def test_batch_split_matmuls_equal_the_unsplit_ones():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4 * 6, 16, generator=gen)  # 4 samples x 6 tokens, as a transformer's linear sees them
    w, bias = torch.randn(16, 10, generator=gen), torch.randn(10, generator=gen)
    torch.testing.assert_close(torch.cat([torch.addmm(bias, xs, w) for xs in x.chunk(2)]), torch.addmm(bias, x, w))
    q, k = torch.randn(8, 6, 4, generator=gen), torch.randn(8, 4, 6, generator=gen)  # (batch x heads) leading
    torch.testing.assert_close(torch.cat([torch.bmm(a, c) for a, c in zip(q.chunk(2), k.chunk(2), strict=True)]), torch.bmm(q, k))


def test_part_flops_are_what_a_real_part_costs():
    built = convnet()
    s = split_operators(build_op_graph(built), 2, batch=4, min_share=0.0)
    conv = s.nodes[s.index()["fwd:2:convolution/part0"]]
    conv_bwd = s.nodes[s.index()["bwd:2:convolution_backward/part1"]]
    x = torch.randn(2, 4, 8, 8, requires_grad=True)  # half of batch 4 at the second conv
    w = torch.randn(4, 4, 3, 3, requires_grad=True)
    with FlopCounterMode(display=False) as fwd:
        y = F.conv2d(x, w, padding=1)
    with FlopCounterMode(display=False) as bwd:
        y.backward(torch.ones_like(y))
    assert conv.flops.at(4) == fwd.get_total_flops()
    assert conv_bwd.flops.at(4) == bwd.get_total_flops()


# --------------------------------------------------------------------- measured operators (profiling)
def test_operator_profile_times_every_node_once_per_distinct_call():
    from paraplan.profiling.operators import profile_operators

    built = convnet()
    g = build_op_graph(built)
    times = profile_operators(built, g.traced_batches, repeats=2, threads=1)
    assert set(times.seconds) == {n.name for n in g.nodes} and not times.unmeasured
    assert all(t.fixed >= 0 and t.per_sample >= 0 for t in times.seconds.values())
    assert times.seconds["fwd:0:convolution"].at(4) > 0
    assert times.seconds["bwd:6:t_backward"].at(4) == 0  # a view's backward runs no kernel
    calls = operator_calls(built, 4)
    assert list(calls) == [n.name for n in g.nodes]
    assert [op.__name__ for op, _, _ in calls["fwd:0:convolution"]] == ["convolution.default"]
    # the two ReLUs run on the same shapes: one measurement serves both
    assert 0 < times.distinct_calls < sum(len(c) for c in calls.values())
