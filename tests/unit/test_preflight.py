"""What the model's build function returns against what the loss needs, checked before any rank
starts (issue 27, point 3): these used to fail in the ranks half a minute after the launch (or, for
a float target that broadcasts, not at all)."""

from pathlib import Path

import pytest
from conftest import run_cli_here

from paraplan.errors import ParaplanError
from paraplan.models import source
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import write_plan
from paraplan.runtime.launcher.preflight import check_model_fits_loss

ROOT = Path(__file__).resolve().parents[2]

MODULES = '''
import torch
from torch import nn


def _mlp(outputs):
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, outputs))


def wrong_shape():
    return _mlp(10), torch.randn(4, 8), torch.randn(4, 3)  # mse cannot compare 10 values with 3


def broadcast():
    return _mlp(10), torch.randn(4, 8), torch.randn(4, 1)  # mse would broadcast, silently wrong


def classes():
    return _mlp(4), torch.randn(4, 8), torch.tensor([0, 1, 5, 2])  # class 5 of 4 scores


class TwoHeads(nn.Module):
    def forward(self, x):
        return x, 2 * x


def pair():  # a tuple where the loss needs one tensor
    return nn.Sequential(nn.Linear(8, 4), TwoHeads()), torch.randn(4, 8), torch.randint(0, 4, (4,))


def good():
    return _mlp(4), torch.randn(4, 8), torch.randint(0, 4, (4,))
'''


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    path = tmp_path_factory.mktemp("modules") / "nets.py"
    path.write_text(MODULES)
    return path


def _plan(ref: str, n_layers: int, stages: int = 2) -> Plan:
    cut = [(i * n_layers // stages, (i + 1) * n_layers // stages) for i in range(stages)]
    return Plan(model=ref, cluster="local", n_layers=n_layers, global_batch=8, n_micro=2, schedule="gpipe",
                grad_sync="none", stages=tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(cut)))


def _check(ref: str):
    built = source.build(ref, device="meta")
    layers = built.layers()
    check_model_fits_loss(built, _plan(ref, len(layers), min(2, len(layers))), layers)


@pytest.mark.parametrize("fn,needle", [
    ("wrong_shape", "the model returns (10,) per sample but the float targets are (3,)"),
    ("broadcast", "the model returns (10,) per sample but the float targets are (1,)"),
    ("classes", "the sample targets are classes up to 5 (from 0) but the model returns 4 scores per sample"),
    ("pair", "the model returns a tuple of 2, but its targets need one tensor"),
])
def test_a_model_whose_output_the_loss_cannot_take_is_refused(modules, fn, needle):
    with pytest.raises(ParaplanError) as info:
        _check(f"{modules}:{fn}")
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("ref", ["gpt2-tiny", "lenet-5", str(ROOT / "tests" / "data" / "mixer.py") + ":build", "good"])
def test_models_that_train_pass(modules, ref):
    _check(f"{modules}:good" if ref == "good" else ref)


def test_train_refuses_it_before_launch(modules, tmp_path, capsys):
    ref = f"{modules}:wrong_shape"
    write_plan(_plan(ref, len(source.build(ref, device="meta").layers())), tmp_path / "plan.json")
    res = run_cli_here(capsys, "train", "--plan", str(tmp_path / "plan.json"), "--out-dir", str(tmp_path / "run"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "mean squared error needs the same shape" in res.stderr
    assert not (tmp_path / "run").exists()  # refused before any directory or rank
