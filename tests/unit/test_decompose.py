"""The layer list of every tiny model composes back to the library's own forward pass."""

import pytest
import torch

from paraplan.models import zoo
from paraplan.models.adapters import decompose
from paraplan.models.inputs import make_batch

# the adapters' cuts (an hf entry, a mixture of experts, is cut by models/hf_cut.py, tested there)
TINY = [n for n in zoo.names() if zoo.entry(n).tiny and not zoo.entry(n).hf] + ["lenet-5"]


def _reference_logits(built, x):
    m = built.module
    if built.family == "t5":
        enc, dec = x
        return m(input_ids=enc, decoder_input_ids=dec).logits
    if built.family in ("gpt2", "llama", "bert"):
        return m(input_ids=x).logits
    if built.family in ("vit", "swin", "resnet"):
        return m(pixel_values=x).logits
    return m(x)


@pytest.mark.parametrize("name", TINY)
def test_layers_compose_to_the_model(name):
    built = zoo.build(name, device="cpu", seed=0)
    built.module.eval()
    x, _ = make_batch(built.inputs, 3, seed=1)
    with torch.no_grad():
        expected = _reference_logits(built, x)
        h = x
        for _, _, layer in decompose(built.module, built.family):
            h = layer(h)
    assert h.shape == expected.shape
    torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", TINY)
def test_every_parameter_belongs_to_exactly_one_layer(name):
    built = zoo.build(name, device="meta")
    owners = {}
    for layer_name, _, layer in decompose(built.module, built.family):
        for p in layer.parameters():
            owners.setdefault(id(p), layer_name)
    all_params = {id(p) for p in built.module.parameters()}
    assert set(owners) == all_params


def test_any_sequential_is_cut_into_its_children():
    seq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    layers = decompose(seq)
    assert [name for name, _, _ in layers] == ["0", "1", "2"]
    assert [kind for _, kind, _ in layers] == ["fc", "other", "fc"]
