"""Models the rest of the tests never use — Qwen2, Mistral and OPT from transformers configs, and an
MLP-mixer written as a plain nn.Module, a module reading a parameter of its own root and one without
targets — all the way through plan -> simulate -> train on 2 gloo
ranks, against one process: losses and every updated parameter after 3 steps within 1e-5.

Parameters whose gradient is zero up to rounding (an attention key bias: softmax ignores a
constant added to every score) stay within rounding of their zero start, so the relative error is
taken against max(|reference|, 1e-3): below that norm the check is absolute, at 1e-8.
"""

import json
from pathlib import Path

import pytest
import torch

from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, source
from paraplan.planners.registry import make_plan
from paraplan.planners.request import PlanRequest
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.measure.reference import reference_run
from paraplan.simulator.predict import simulate_plan

from .many import train_many

DATA = Path(__file__).resolve().parent.parent / "data"
SMALL = "num_hidden_layers=4&hidden_size=64&num_attention_heads=4&intermediate_size=128&vocab_size=512&seq_len=32"
MODELS = {
    "qwen2": f"hf:qwen2?{SMALL}&num_key_value_heads=2",
    "mistral": f"hf:mistral?{SMALL}&num_key_value_heads=2",
    "opt": "hf:opt?num_hidden_layers=4&hidden_size=64&num_attention_heads=4&ffn_dim=128&vocab_size=512&seq_len=32",
    "mixer": f"{DATA / 'mixer.py'}:build",
    # issue 46: a parameter and a buffer read by the root module's forward, and a module without
    # targets (trained on the mean of its outputs, the last pipeline stage included)
    "root-param": f"{DATA / 'root_param.py'}:build",
    "no-targets": f"{DATA / 'no_targets.py'}:build",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every model planned (even split, 2 stages, 1F1B) and simulated, then all trained in one launch
    of the 2 ranks (tests/distributed/many.py)."""
    root = tmp_path_factory.mktemp("any")
    out = {}
    for name, ref in MODELS.items():
        built = source.build(ref)
        spec = measure.measure(built)
        costs = analytic_cost_model(spec, load_cluster("local"))
        request = PlanRequest(costs=costs, model_name=built.ref, cluster_name="local", batch=8, n_stages=2,
                              n_micro=4, schedule="1f1b")
        plan = make_plan(request, "even")
        (root / name).mkdir()
        config = TrainConfig(plan=plan, model=plan.model, steps=3, out_dir=str(root / name), dropout=False,
                             optimizer="sgd", lr=0.1)
        out[name] = (built, plan, simulate_plan(plan, costs), config)
    train_many([config for *_, config in out.values()], 2)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_any_model_plans_simulates_and_trains_like_one_process(runs, name):
    built, plan, sim, config = runs[name]
    assert plan.model == built.ref and plan.n_stages == 2
    assert sim.prediction.iteration_s > 0 and sim.prediction.feasible
    out = Path(config.out_dir)
    losses = json.loads((out / "losses.json").read_text())
    ref_losses, ref_params = reference_run(config)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = set()
    for stage in range(plan.n_stages):
        for pname, value in torch.load(out / f"stage{stage}.pt").items():
            ref = ref_params[pname]
            error = float((value - ref).norm() / ref.norm().clamp_min(1e-3))
            assert error < 1e-5, pname
            seen.add(pname)
    assert seen == set(ref_params)
    # the run learned something: the parameters moved
    assert losses[-1] != losses[0]
