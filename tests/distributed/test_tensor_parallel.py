"""Megatron-style tensor parallelism (runtime/layers/tensor_parallel.py) on 2 gloo ranks against one process.

One spawn runs every model (starting processes and importing transformers is most of the time on
this 2-core machine): each rank builds and materialises the whole model, applies TP to every layer
that tp_refusal accepts (one memo, so GPT-2's, BERT's and T5's tied embeddings stay tied), runs one
forward + backward and one SGD step, and saves what the parent compares with an unsharded run made
by rank 0 of the same seeded model:
  - the loss, within 1e-5 relative;
  - the gradient of every layer's input, whole and identical on both ranks;
  - every full gradient (full_gradients) and every full parameter after the step (full_parameters).
Errors are max|a - b| / max(max|ref|, 1e-3): gradients that are zero up to rounding (an attention
key bias: softmax ignores a constant added to every score) are then checked absolutely, at 1e-8.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from paraplan.runtime.layers.tensor_parallel import tp_refusal
from paraplan.runtime.rank.materialize import build_layers
from paraplan.system.localnet import free_port
from paraplan.system.processes import start_method

MODELS = ["gpt2-tiny", "llama-tiny", "bert-tiny", "vit-tiny", "t5-tiny", "swin-tiny", "lenet-5"]
BATCH, LR, TOL = 4, 0.1, 1e-5


def _tensors(value):
    return [value] if isinstance(value, torch.Tensor) else [t for t in value if isinstance(t, torch.Tensor)]


def _step(built, layers, x, y):
    """Forward layer by layer keeping each layer's input gradient, backward, and the loss."""
    inputs, h = [], x
    for _, _, module in layers:
        for t in _tensors(h):
            if t.requires_grad:
                t.retain_grad()
        inputs.append(h)
        h = module(h)
    loss = built.loss(h, y)
    loss.backward()
    grads = [[t.grad.clone() for t in _tensors(h) if t.grad is not None] for h in inputs]
    return float(loss.detach()), grads


def _model_run(model: str, rank: int, mesh) -> dict:
    from paraplan.runtime.layers.tp_apply import apply_tensor_parallel, full_gradients, full_parameters
    from paraplan.runtime.rank.materialize import materialize

    def build():
        built, layers, names = build_layers(model, seed=0, dropout=False)
        materialize([m for _, _, m in layers], names, seed=0, device=torch.device("cpu"))
        x, y = built.batch(BATCH, seed=0)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x.requires_grad_(True)  # the embedding layer's input gradient is checked too
        elif isinstance(x, torch.Tensor):
            # token 0 (BERT's padding_idx) and 256 (the first row of rank 1's half of the vocabulary)
            x[0, :2] = torch.tensor([0, 256])
        return built, layers, names, x, y

    def names_of(layers, names):  # layer path -> name in the whole model (tied: the first name)
        return [{path: names[id(p)] for path, p in m.named_parameters(remove_duplicate=False)}
                for _, _, m in layers]

    out = {}
    if rank == 0:  # the unsharded reference, in this process, with no collective
        built, layers, names, x, y = build()
        loss, grads = _step(built, layers, x, y)
        params = {id(p): p for _, _, m in layers for p in m.parameters()}
        out["ref_grads"] = {names[id(p)]: p.grad.clone() for p in params.values()}
        torch.optim.SGD(list(params.values()), lr=LR).step()
        out["ref_params"] = {names[id(p)]: p.detach().clone() for p in params.values()}
        out["ref_loss"], out["ref_input_grads"], out["ref_unique"] = loss, grads, len(params)

    built, layers, names, x, y = build()
    paths = names_of(layers, names)
    memo, refused = {}, {}
    for name, _, module in layers:
        why = tp_refusal(module, mesh.size())
        if why is None:
            apply_tensor_parallel(module, mesh, memo)
        else:  # left unsharded: replicated on both ranks; applying TP says why it cannot
            with pytest.raises(ValueError, match="not divisible|no tensor-parallel plan") as exc:
                apply_tensor_parallel(module, mesh, memo)
            refused[name] = (why, str(exc.value))
    out["refused"] = refused
    out["loss"], out["input_grads"] = _step(built, layers, x, y)

    def whole(per_layer):
        merged = {}
        for mapping, values in zip(paths, per_layer, strict=True):
            merged.update({mapping[path]: value for path, value in values.items()})
        return merged

    out["grads"] = whole([full_gradients(m) for _, _, m in layers])
    unique = list({id(p): p for _, _, m in layers for p in m.parameters()}.values())
    out["unique"] = len(unique)  # tied parameters (GPT-2's wte and LM head) still one tensor
    out["sharded"] = sum(isinstance(p, DTensor) for p in unique)
    # the gradients of sharded parameters are sharded alike (no whole gradient kept on any rank)
    out["grad_layouts"] = [(p.placements, p.grad.placements) for p in unique if isinstance(p, DTensor)]
    torch.optim.SGD(unique, lr=LR, foreach=False).step()
    out["params"] = whole([full_parameters(m) for _, _, m in layers])
    return out


def _tie_conflict(mesh) -> str:
    """A parameter tied between a vocab-parallel embedding (Shard(0)) and a Linear that TP leaves
    replicated cannot be both: apply_tensor_parallel must say so, naming it."""
    from torch import nn

    from paraplan.runtime.layers.tp_apply import apply_tensor_parallel

    torch.manual_seed(0)  # the same values on both ranks
    embedding, other = nn.Embedding(8, 4), nn.Sequential()
    other.add_module("reduction", nn.Linear(4, 8, bias=False))  # not a head projection and, with a
    other.add_module("mixing", nn.Linear(8, 8))  # second matrix beside it, not a lone Linear: replicated
    # an MLP pair the layer does shard: a layer of replicated Linears alone is refused before any tie
    other.add_module("fc1", nn.Linear(8, 16))
    other.add_module("fc2", nn.Linear(16, 8))
    other.reduction.weight = embedding.weight
    memo = {}
    apply_tensor_parallel(embedding, mesh, memo)
    try:
        apply_tensor_parallel(other, mesh, memo)
    except ValueError as exc:
        return str(exc)
    return ""


def _padding_errors(mesh) -> list[float]:
    """A vocab-parallel embedding with a padding_idx (whose row gets no gradient) in rank 0's rows
    or in rank 1's: its gradient is the unsharded one, and sharded as the weight."""
    from torch import nn

    from paraplan.runtime.layers.tp_apply import apply_tensor_parallel, full_gradients

    errors = []
    for padding in (1, 5):  # a row of rank 0, a row of rank 1
        torch.manual_seed(0)
        ref = nn.Embedding(8, 4, padding_idx=padding)
        tp = nn.Embedding(8, 4, padding_idx=padding)
        tp.load_state_dict(ref.state_dict())
        apply_tensor_parallel(tp, mesh)
        ids = torch.tensor([[0, 1, 4, 5, 7, 1, 4]])
        weights = torch.arange(28.0).reshape(1, 7, 4)  # a loss that tells the rows apart
        (ref(ids) * weights).sum().backward()
        (tp(ids) * weights).sum().backward()
        errors.append(_error(full_gradients(tp)["weight"], ref.weight.grad))
        errors.append(0.0 if tp.weight.grad.placements == tp.weight.placements else 1.0)
    return errors


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        results = {model: _model_run(model, rank, mesh) for model in MODELS}
        results["tie-conflict"] = _tie_conflict(mesh)
        results["padding"] = _padding_errors(mesh)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # shared/notes/runtime-on-cpu.md: a rare abort at exit after DTensor runs otherwise
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    mp.start_processes(_worker, args=(2, free_port(), str(out)), nprocs=2, join=True, start_method=start_method())
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def _error(value: torch.Tensor, ref: torch.Tensor) -> float:
    assert value.shape == ref.shape
    return float((value - ref).abs().max() / max(float(ref.abs().max()), 1e-3))


@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_matches_one_process(results, model):
    ranks = [r[model] for r in results]
    ref = ranks[0]
    if model == "swin-tiny":  # stage 0 has one head: that block stays replicated, the rest is TP
        assert set(ref["refused"]) == {"stage0.block0"}
        why, raised = ref["refused"]["stage0.block0"]
        assert "1 attention head not divisible by 2" in why and why in raised
    elif model == "lenet-5":  # the convolutions stay replicated; each classifier Linear column-parallel
        assert set(ref["refused"]) == {"conv1", "conv2"}
    else:
        assert ref["refused"] == {}
    for out in ranks:
        assert out["loss"] == pytest.approx(ref["ref_loss"], rel=TOL)
        # the input gradient of every layer comes back whole, and the same on every rank
        for i, (got, want) in enumerate(zip(out["input_grads"], ref["ref_input_grads"], strict=True)):
            assert len(got) == len(want), i
            for g, w in zip(got, want, strict=True):
                assert _error(g, w) < TOL, f"input gradient of layer {i}"
        assert set(out["grads"]) == set(ref["ref_grads"])  # every parameter of the model
        for name, grad in out["grads"].items():
            assert _error(grad, ref["ref_grads"][name]) < TOL, name
        assert set(out["params"]) == set(ref["ref_params"])
        for name, value in out["params"].items():
            assert _error(value, ref["ref_params"][name]) < TOL, name
    assert ranks[0]["input_grads"][-1][0].equal(ranks[1]["input_grads"][-1][0])
    assert ref["unique"] == ref["ref_unique"] and ref["sharded"] > 0
    assert all(param == grad for param, grad in ref["grad_layouts"])


def test_a_tie_that_needs_two_layouts_is_refused(results):
    message = results[0]["tie-conflict"]
    assert "reduction.weight" in message and "replicated" in message and "Shard(dim=0)" in message


def _layer(model: str, name: str):
    _, layers, _ = build_layers(model, seed=0, dropout=False)  # parameters on meta: inspection only
    return dict((n, m) for n, _, m in layers)[name]


@pytest.mark.parametrize("model,name,tp,needle", [
    ("gpt2-tiny", "block0", 3, "4 attention heads not divisible by 3"),
    ("gpt2-tiny", "embedding", 3, "vocabulary 512 not divisible by 3"),
    ("llama-tiny", "block1", 4, "2 key/value heads not divisible by 4"),  # GQA: 4 query heads, 2 kv
    ("bert-tiny", "block0", 3, "not divisible by 3"),
    ("vit-tiny", "head", 4, "10 outputs not divisible by 4"),
    ("t5-tiny", "decoder.block1", 3, "4 attention heads not divisible by 3"),
    ("swin-tiny", "stage0.block0", 2, "1 attention head not divisible by 2"),
    ("resnet-tiny", "stage0.block0", 2, "convolutions have no tensor-parallel plan"),
    ("lenet-5", "conv1", 2, "convolutions have no tensor-parallel plan"),
    ("lenet-5", "fc3", 4, "10 outputs not divisible by 4"),  # a lone Linear: column-parallel
])
def test_tp_refusal_says_why_in_one_line(model, name, tp, needle):
    why = tp_refusal(_layer(model, name), tp)
    assert why is not None and needle in why and "\n" not in why


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny", "bert-tiny", "vit-tiny", "t5-tiny"])
def test_tp_refusal_accepts_every_layer_of_the_tiny_transformers(model):
    _, layers, _ = build_layers(model, seed=0, dropout=False)
    for tp in (1, 2):
        assert [(n, tp_refusal(m, tp)) for n, _, m in layers if tp_refusal(m, tp)] == []


def test_vocab_parallel_embedding_keeps_its_padding_row_without_gradient(results):
    assert max(results[0]["padding"] + results[1]["padding"]) < TOL
