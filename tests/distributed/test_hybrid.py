"""Plans with per-layer strategies (Galvatron-BMW) on real gloo processes, against one process of
the same model, data and seed: after 3 steps, losses and every parameter (gathered from its shards)
within 1e-5 relative (against max(|reference|, 1e-3): see tests/distributed/test_any_model.py).
SGD, as in test_runtime.py: Adam turns rounding noise in zero gradients into full-size steps.
The 2-rank and the 4-rank plans each run in one launch of the ranks (tests/distributed/many.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paraplan_process import run_paraplan

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan import LayerStrategy as S
from paraplan.plans.plan_file import read_plan, write_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.measure.reference import reference_run

from .many import train_many

MODELS = ["gpt2-tiny", "llama-tiny"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _plan(model, stages, n_layers=6, batch=8, micro=2, schedule="1f1b"):
    return Plan(model=model, cluster="local", n_layers=n_layers, global_batch=batch, n_micro=micro,
                schedule=schedule, grad_sync="none", stages=stages)


def _one_stage(model, strategies, world):
    return _plan(model, (Stage(LayerRange(0, len(strategies)), tuple(range(world)), strategies=tuple(strategies)),))


def _planned(tmp_path, model, planner, batch, memory):
    """A plan straight from `paraplan plan` (in this process: the command line's own code path)."""
    from paraplan.cli import main

    out = tmp_path / f"{model}-{planner}.json"
    assert main(["plan", "--planner", planner, "--model", model, "--cluster", "local", "--batch", str(batch),
                 "--memory", memory, "--out", str(out)]) == 0
    return read_plan(out)


def _config(plan, out_dir, **kw):
    kw = {"steps": 3, "optimizer": "sgd", "lr": 0.1, **kw}
    return TrainConfig(plan=plan, model=plan.model, out_dir=str(out_dir), dropout=False, **kw)


# the runs of each launch: name -> (plan, extra TrainConfig fields)
def _two_rank_plans(tmp_path):
    plans = {}
    for model in MODELS:
        plans[f"sdp-{model}"] = (_one_stage(model, [S(sdp=2)] * 6, 2), {})
        plans[f"tp-{model}"] = (_one_stage(model, [S(tp=2)] * 6, 2), {})
    for model in MODELS + ["bert-tiny"]:
        plans[f"bmw-{model}"] = (_planned(tmp_path, model, "galvatron-bmw", 16, "6MiB"), {})
    for ckpt in (False, True):
        strategies = [S(dp=2)] + [S(dp=2, recompute="full" if ckpt else "none")] * 4 + [S(dp=2)]
        plans[f"ckpt-{ckpt}"] = (_one_stage("gpt2-tiny", strategies, 2), {"optimizer": "adam", "steps": 2})
    # a CNN: the convolutions data parallel, each classifier layer's lone Linear column-parallel
    lenet = Stage(LayerRange(0, 5), (0, 1), strategies=(S(dp=2), S(dp=2), S(tp=2), S(tp=2), S(tp=2)))
    plans["tp-lenet-5"] = (_plan("lenet-5", (lenet,), n_layers=5), {})
    return plans


def _four_rank_plans():
    plans = {}
    for model in MODELS:
        plans[f"dptp-{model}"] = (_one_stage(model, [S(dp=2, tp=2)] * 6, 4), {})
        stages = (Stage(LayerRange(0, 3), (0, 1), strategies=(S(dp=2), S(tp=2, recompute="full"), S(sdp=2))),
                  Stage(LayerRange(3, 6), (2, 3), strategies=(S(tp=2), S(sdp=2, recompute="full"), S(dp=2))))
        plans[f"stages-{model}"] = (_plan(model, stages), {"clip_norm": 0.05})
    hsdp = [S(dp=2, sdp=2)] * 3 + [S(dp=2, sdp=2, order="dp,sdp,tp")] * 3
    plans["hsdp"] = (_one_stage("llama-tiny", hsdp, 4), {})
    return plans


def _launch(root, plans, world):
    configs = {}
    for name, (plan, kw) in plans.items():
        (root / name).mkdir()
        configs[name] = _config(plan, root / name, **kw)
    train_many(list(configs.values()), world)
    return configs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    return _launch(root, _two_rank_plans(root), 2)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("four"), _four_rank_plans(), 4)


def check_against_one_process(config):
    out = Path(config.out_dir)
    losses = json.loads((out / "losses.json").read_text())
    ref_losses, ref_params = reference_run(config)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = set()
    for s in range(config.plan.n_stages):
        for name, value in torch.load(out / f"stage{s}.pt").items():
            ref = ref_params[name]
            assert value.shape == ref.shape, name
            assert float((value - ref).norm() / ref.norm().clamp_min(1e-3)) < 1e-5, name
            seen.add(name)
    assert seen == set(ref_params)  # every parameter of the model was checked
    assert losses[-1] != losses[0]
    return [json.loads((out / f"memory_rank{r}.json").read_text()) for r in range(len(config.plan.devices))]


def _parameter_bytes(model):
    from paraplan.runtime.rank.materialize import build_layers

    _, layers, _ = build_layers(model)
    return sum({id(p): p.numel() * 4 for _, _, m in layers for p in m.parameters()}.values())


@pytest.mark.parametrize("model", MODELS)
def test_sharded_data_parallel_on_two_ranks(two_ranks, model):
    """(a) SDP2 on every layer: FSDP2; GPT-2's tied embedding and head are one FSDP2 unit."""
    memory = check_against_one_process(two_ranks[f"sdp-{model}"])
    for m in memory:  # each rank holds half of the parameters
        assert m["params"] == pytest.approx(_parameter_bytes(model) / 2, rel=0.02)


@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_on_two_ranks(two_ranks, model):
    """(b) TP2 on every layer: vocab-parallel embedding, Megatron blocks, column-parallel head."""
    memory = check_against_one_process(two_ranks[f"tp-{model}"])
    full = _parameter_bytes(model)
    for m in memory:  # the norms stay whole: a little more than half
        assert full / 2 <= m["params"] < 0.6 * full


@pytest.mark.parametrize("model", MODELS)
def test_data_times_tensor_parallel_on_four_ranks(four_ranks, model):
    """(c) DP2 x TP2: tp inner-most (devices 0,1 and 2,3 split each layer), the dp all-reduce on
    the local shards."""
    check_against_one_process(four_ranks[f"dptp-{model}"])


@pytest.mark.parametrize("model", MODELS)
def test_two_stages_with_different_strategies_and_checkpointing(four_ranks, model):
    """(d) 2 stages x 2 devices, DP / SDP / TP / CKPT mixed in each stage, Slice-Gather between
    them and across the stage boundary, GPT-2's tied weight across stages (the embedding and the
    head share a strategy, as they must), gradient clipping over sharded and split layers."""
    check_against_one_process(four_ranks[f"stages-{model}"])


def test_hybrid_sharding_in_both_layouts_on_four_ranks(four_ranks):
    """DP2 x SDP2 (HSDP) with sdp inner-most, then with dp inner-most."""
    check_against_one_process(four_ranks["hsdp"])


@pytest.mark.parametrize("model", MODELS + ["bert-tiny"])
def test_a_galvatron_bmw_plan_straight_from_the_planner(two_ranks, model):
    """(e) `paraplan plan --planner galvatron-bmw` on the local cluster, memory tight enough that it
    mixes strategies and checkpointing; BERT is used by no other distributed test."""
    config = two_ranks[f"bmw-{model}"]
    assert any(s.checkpoint for st in config.plan.stages for s in st.strategies)
    check_against_one_process(config)


def test_checkpointing_lowers_the_measured_activations_as_predicted(two_ranks):
    """The same DP2 plan with and without CKPT on every block (Adam, the default): the measured
    saved activations drop, by about what the memory model predicts."""
    from paraplan.costs.memory import plan_memory
    from paraplan.models import measure, source

    spec = measure.measure(source.build("gpt2-tiny"))
    measured, predicted = {}, {}
    for ckpt in (False, True):
        config = two_ranks[f"ckpt-{ckpt}"]
        measured[ckpt] = json.loads((Path(config.out_dir) / "memory_rank0.json").read_text())
        _, breakdowns = plan_memory(config.plan, spec, {0: 2**34, 1: 2**34}, device_kind="cpu-core")
        predicted[ckpt] = breakdowns[0]
    assert measured[True]["activations"] < 0.6 * measured[False]["activations"]
    saved_measured = measured[False]["activations"] - measured[True]["activations"]
    saved_predicted = predicted[False].activation_bytes - predicted[True].activation_bytes
    assert saved_measured == pytest.approx(saved_predicted, rel=0.25)
    # parameters, gradients and Adam's two moments: the planner's 16 bytes per parameter
    states = measured[True]["params"] + measured[True]["grads"] + measured[True]["optimizer"]
    assert states == pytest.approx(predicted[True].states_bytes, rel=0.01)


def test_a_cnn_s_classifier_runs_column_parallel_as_predicted(two_ranks):
    """LeNet-5's classifier layers (a lone Linear each) under TP2: column-parallel with the output
    gathered, like one process; each rank holds half of their parameters, as the planner counts (they
    ran replicated before, at twice the states predicted), and the measured activations leave the
    weight shards out (autograd saves a DTensor weight's local shard as a plain tensor)."""
    from paraplan.costs.memory import plan_memory
    from paraplan.models import measure, source

    config = two_ranks["tp-lenet-5"]
    check_against_one_process(config)
    built = source.build("lenet-5")
    layers = [m for _, _, m in built.layers()]
    conv, fc = (sum(p.numel() * 4 for m in layers[a:b] for p in m.parameters()) for a, b in ((0, 2), (2, 5)))
    _, breakdowns = plan_memory(config.plan, measure.measure(built), {0: 2**34, 1: 2**34}, device_kind="cpu-core")
    predicted = breakdowns[0]  # one group computing together: its devices alike
    for rank in (0, 1):
        measured = json.loads((Path(config.out_dir) / f"memory_rank{rank}.json").read_text())
        assert measured["params"] == conv + fc // 2, rank
        assert 0.5 * predicted.activation_bytes <= measured["activations"] <= 1.25 * predicted.activation_bytes, \
            (rank, measured, predicted)


def test_two_torchrun_nodes_run_a_hybrid_plan_like_one_process(tmp_path):
    """The same program under torchrun, one rank per "node": TP2, SDP2 and DP2 layers."""
    from paraplan.system.localnet import free_port

    plan = _one_stage("llama-tiny", [S(tp=2), S(sdp=2), S(tp=2, recompute="full"), S(dp=2), S(sdp=2), S(tp=2)], 2)
    plan_path = tmp_path / "plan.json"
    write_plan(plan, plan_path)
    out = tmp_path / "out"
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "paraplan", "train", "--plan", str(plan_path),
           "--steps", "3", "--no-dropout", "--optimizer", "sgd", "--lr", "0.1", "--out-dir", str(out)]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for _ in range(2)]
    results = [n.communicate(timeout=240) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), results
    check_against_one_process(_config(plan, out))


def test_unsupported_combinations_are_refused_before_launch(tmp_path):
    """One line naming the layer and the reason, before any rank starts: on the command line (exit
    status 2, nothing written), and the checks behind it."""
    from paraplan.models import source
    from paraplan.runtime.layers.hybrid import hybrid_refusal

    # GPT-2's wte is shared by the embedding and the head: they need one strategy
    tied = _one_stage("gpt2-tiny", [S(tp=2)] + [S(dp=2)] * 5, 2)
    path = tmp_path / "plan.json"
    write_plan(tied, path)
    res = run_paraplan("train", "--plan", str(path), "--steps", "1",
                          "--out-dir", str(tmp_path / "never"), env=ENV, timeout=120)
    assert res.returncode == 2 and "share a parameter" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "layers 0 (embedding" in res.stderr
    assert not (tmp_path / "never").exists()
    cases = {
        "not divisible by 4": _one_stage("llama-tiny", [S(tp=4)] * 6, 4),  # 2 key/value heads
        "convolution": _one_stage("lenet-5", [S(tp=2)] * 5, 2),
    }
    for needle, plan in cases.items():
        reason = hybrid_refusal(plan, source.build(plan.model).layers())
        assert reason and needle in reason and re.match(r"layer \d+ \(\w+, ", reason), reason
    assert hybrid_refusal(_one_stage("llama-tiny", [S(tp=2)] * 6, 2), source.build("llama-tiny").layers()) is None
