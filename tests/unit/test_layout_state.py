"""runtime/state/layout_state.py in one process (DCP without a process group): the state keyed by the
model's parameter names, loaded back into another copy of the model, and a parameter that had no
optimizer state when it was saved keeps none (the review of issue 32's checkpoints: it failed with
"Missing key in checkpoint state_dict")."""

import torch

from paraplan.runtime.state import layout_state


def _model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))


def test_a_state_saved_with_a_parameter_never_stepped_loads_and_continues_alike(tmp_path):
    model = _model(0)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    model[0](torch.randn(2, 4)).sum().backward()  # only the first layer gets a gradient
    optim.step()
    layout_state.save(dict(model.named_parameters()), optim, str(tmp_path / "state"))
    copy = _model(1)  # other weights, to be replaced
    optim_copy = torch.optim.Adam(copy.parameters(), lr=1e-2)
    layout_state.load(dict(copy.named_parameters()), optim_copy, str(tmp_path / "state"))
    for a, b in zip(model.parameters(), copy.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(optim_copy.state) == len(optim.state) == 2  # the second layer has no state, as it had none
    # one more step of both from the same batch: the same parameters again
    x = torch.randn(3, 4)
    for m, o in ((model, optim), (copy, optim_copy)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), copy.parameters(), strict=True):
        assert torch.equal(a, b)
