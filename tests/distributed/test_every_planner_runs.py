"""Every planner's plan runs with `paraplan train`, or is refused before launch in one line: each
registered planner plans tiny GPT-2 (LeNet-5 for the operator placements) on the `local` cluster
through the command line's own code path, and every plan that passes the launch checks trains 2
steps on real gloo ranks and equals one process (losses and parameters, 1e-5 relative). The
README's table of what runs is this test's list."""

import json
from pathlib import Path

import pytest
import torch

from paraplan.errors import ParaplanError
from paraplan.planners.registry import planner, planner_names
from paraplan.plans.plan_file import read_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.launcher.launch import check_before_launch
from paraplan.runtime.measure.reference import reference_run
from paraplan.runtime.rank.materialize import build_layers

from .many import train_many

BATCH = 8


def _model(name: str) -> str:
    return "lenet-5" if planner(name).needs_operators else "gpt2-tiny"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from paraplan.cli import main

    root = tmp_path_factory.mktemp("planners")
    configs, refused = {}, {}
    for name in planner_names():
        model = _model(name)
        path = root / f"{name}.json"
        assert main(["plan", "--planner", name, "--model", model, "--cluster", "local", "--batch", str(BATCH),
                     "--out", str(path)]) == 0, name
        plan = read_plan(path)
        (root / name).mkdir()
        config = TrainConfig(plan=plan, model=model, steps=2, optimizer="sgd", lr=0.1, dropout=False,
                             out_dir=str(root / name))
        _, layers, _ = build_layers(model)
        try:
            check_before_launch(config, len(plan.devices), plan.n_layers, layers)
        except ParaplanError as exc:
            refused[name] = str(exc)
            continue
        configs[name] = config
    by_world: dict[int, list] = {}
    for config in configs.values():
        by_world.setdefault(len(config.plan.devices), []).append(config)
    for world, group in sorted(by_world.items()):
        train_many(group, world)
    return configs, refused


@pytest.mark.parametrize("name", planner_names())
def test_every_planners_plan_runs_or_is_refused_in_one_line(runs, name):
    configs, refused = runs
    if name in refused:
        assert "\n" not in refused[name] and refused[name], name
        return
    config = configs[name]
    out = Path(config.out_dir)
    losses = json.loads((out / "losses.json").read_text())
    ref_losses, ref_params = reference_run(config)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = {}
    for f in out.glob("stage*.pt"):
        seen.update(torch.load(f))
    assert set(seen) == set(ref_params)
    for n, v in seen.items():
        assert float((v - ref_params[n]).norm() / ref_params[n].norm().clamp_min(1e-3)) < 1e-5, (name, n)


def test_the_non_operator_planners_all_run(runs):
    """Every planner of stages (pipelines, groups, per-layer strategies, Bi-Partition) runs."""
    _, refused = runs
    assert not [n for n in refused if not planner(n).needs_operators], refused
