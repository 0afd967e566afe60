"""The profiler on real CPU runs (1 thread, seconds): structure, plumbing and the fits."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import run_cli_here
from paraplan_process import run_paraplan

from paraplan.costs.model import profile_cost_model
from paraplan.costs.timefn import PiecewiseLinear
from paraplan.errors import ParaplanError
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.models.adapters import decompose
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.profiling.links import fit_alpha_beta
from paraplan.profiling.profile_file import profile_from_dict, profile_to_dict, read_profile, write_profile
from paraplan.profiling.profiler import run_profile, zoo_workload
from paraplan.simulator.predict import simulate_plan

CPU = torch.device("cpu")
SIZES = [1, 64]


@pytest.fixture(scope="module")
def profiles():
    return {name: run_profile(zoo_workload(name, CPU), CPU, SIZES, threads=1, warmup=1, repeats=3)
            for name in ("lenet-5", "gpt2-tiny", "resnet-tiny")}


@pytest.mark.parametrize("name", ["lenet-5", "gpt2-tiny", "resnet-tiny"])
def test_every_layer_is_timed_forward_and_backward(profiles, name):
    profile = profiles[name]
    built = zoo.build(name)
    assert [layer.name for layer in profile.layers] == [n for n, _, _ in decompose(built.module, built.family)]
    for layer in profile.layers:
        assert layer.batch_sizes == tuple(SIZES)
        assert all(t.median_s > 0 and t.min_s <= t.median_s <= t.max_s for t in layer.forward + layer.backward)
        assert all(t.repeats == 3 for t in layer.forward)
        assert layer.output_bytes[1] == 64 * layer.output_bytes[0]  # bytes are per sample
        assert all(p >= o for p, o in zip(layer.peak_bytes, layer.output_bytes, strict=True))
    total = [sum(layer.forward[k].median_s + layer.backward[k].median_s for layer in profile.layers) for k in (0, 1)]
    assert total[1] > 2 * total[0]  # 64 samples cost more than one
    # the heavy layers grow with the batch on their own too. Compared on the fastest repeat: under
    # `pytest -n 2` the other worker's gloo ranks share the 2 cores, and one contended 0.4 ms
    # batch-1 median once outgrew a 1.8 ms batch-64 one (resnet-tiny's last block, CI stop 22)
    heavy = [layer for layer in profile.layers if layer.kind in ("block", "conv")]
    assert heavy and all(layer.forward[1].min_s > layer.forward[0].min_s for layer in heavy)


def test_profile_records_where_and_how_it_was_taken(profiles):
    p = profiles["gpt2-tiny"]
    assert p.threads == 1 and p.torch_version == torch.__version__ and p.device == "cpu"
    assert p.machine and p.device_name and p.date[:2] == "20"
    assert p.step_check is not None and p.step_check.measured.median_s > 0
    assert len(p.repeatability) == len(p.layers) and all(r > 0 for r in p.repeatability)


def test_profile_json_round_trip(profiles, tmp_path):
    p = profiles["resnet-tiny"]
    path = tmp_path / "profile.json"
    write_profile(p, path)
    assert read_profile(path) == p
    data = profile_to_dict(p)
    data["layers"][2]["forward"] = data["layers"][2]["forward"][:1]
    with pytest.raises(ParaplanError, match=r"layers\[2\].forward: expected 2 entries"):
        profile_from_dict(data, "p.json")
    with pytest.raises(ParaplanError, match="format_version"):
        profile_from_dict({**profile_to_dict(p), "format_version": 9}, "p.json")


def test_a_profile_drives_the_simulator(profiles):
    spec = measure.measure(zoo.build("gpt2-tiny"))
    cluster = load_cluster("local")
    cm = profile_cost_model(spec, cluster, profiles["gpt2-tiny"])
    plan = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=64, n_micro=1, schedule="gpipe",
                grad_sync="none", stages=(Stage(LayerRange(0, 6), (0,)),))
    sim = simulate_plan(plan, cm)
    measured = sum(layer.forward[1].median_s + layer.backward[1].median_s for layer in profiles["gpt2-tiny"].layers)
    assert sim.prediction.iteration_s == pytest.approx(measured)
    with pytest.raises(ParaplanError, match="measured for .lenet-5., not .gpt2-tiny."):
        profile_cost_model(spec, cluster, profiles["lenet-5"])


def test_piecewise_linear_rule_beyond_the_measurements():
    f = PiecewiseLinear((2.0, 4.0, 8.0), (1.0, 1.5, 2.5))
    assert f(3.0) == pytest.approx(1.25)
    assert f(1.0) == 1.0  # below the smallest: the smallest's time
    assert f(16.0) == pytest.approx(2.5 + 8 * 0.25)  # above: the last slope
    assert np.allclose(f(np.array([2.0, 8.0])), [1.0, 2.5])


def test_alpha_beta_fit_never_gives_a_negative_slope():
    sizes = [1024, 4096, 16384]
    fit = fit_alpha_beta(sizes, [2e-3, 1e-3, 1.1e-3])  # latency noise hides the bandwidth
    assert fit.bandwidth_bytes_per_s <= 16384 / 1.1e-3 * (1 + 1e-9) and fit.latency_s >= 0


def test_alpha_beta_fit_recovers_known_values():
    sizes = np.array([2**k for k in range(10, 28, 2)], dtype=float)
    fit = fit_alpha_beta(sizes, 1.5e-3 + sizes / 2.2e9)
    assert fit.latency_s == pytest.approx(1.5e-3, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(2.2e9, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0)


ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _cli(*args, timeout=300):
    return run_paraplan(*args, env=ENV,
                          timeout=timeout)


def test_profile_links_measures_real_processes(tmp_path):
    out = tmp_path / "cluster.toml"
    res = _cli("profile-links", "--nproc", "2", "--max-bytes", str(2**20), "--out", str(out))
    assert res.returncode == 0, res.stderr
    cluster = load_cluster(str(out))
    link = cluster.link(0, 1)
    assert cluster.name == "local-measured"
    assert 1e7 < link.bandwidth_bytes_per_s < 1e12 and 0 <= link.latency_s < 0.05


def test_profile_a_users_module(tmp_path):
    src = tmp_path / "mine.py"
    src.write_text("import torch\n"
                   "def build():\n"
                   "    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
                   "    return model, torch.randn(2, 8)\n")
    out = tmp_path / "p.json"
    res = _cli("profile", "--module", f"{src}:build", "--batch-sizes", "1,4", "--repeats", "2", "--warmup", "1",
               "--no-checks", "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert [layer["name"] for layer in data["layers"]] == ["0", "1", "2"]
    assert data["layers"][0]["output_bytes"] == [32 * 4, 4 * 32 * 4]


@pytest.mark.parametrize("args,needle", [
    (("profile", "lenet-5", "--batch-sizes", "a,b"), "--batch-sizes: expected comma-separated integers"),
    (("profile", "lenet-5", "--batch-sizes", "0,2"), "sizes must be positive"),
    (("profile", "lenet-5", "--repeats", "0"), "--repeats must be positive"),
    (("profile",), "give one model"),
    (("profile", "--module", "nowhere.py:build"), "no such file"),
    (("profile", "lenet-5", "--device", "cuda"), "no GPU"),
    (("profile-links", "--nproc", "1"), "need at least 2 processes"),
])
def test_profile_bad_input(args, needle, capsys):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = run_cli_here(capsys, *args)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_simulate_with_a_measured_profile(tmp_path, capsys):
    """In this process (the other tests here run the command line as separate processes)."""
    profile = tmp_path / "gpt2-tiny.json"
    res = run_cli_here(capsys, "profile", "gpt2-tiny", "--batch-sizes", "4,8", "--repeats", "2", "--warmup", "1", "--no-checks",
               "--out", str(profile))
    assert res.returncode == 0, res.stderr
    plan = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gpt2-tiny-local-1f1b-2x4.json")
    res = run_cli_here(capsys, "simulate", plan, "--profile", str(profile), "--json")
    assert res.returncode == 0, res.stderr
    # the CLI used the profile: its prediction is the in-process one with measured costs, not the analytic one
    from paraplan.costs.model import analytic_cost_model, profile_cost_model
    from paraplan.hardware import load_cluster
    from paraplan.models import measure, zoo
    from paraplan.plans.plan_file import read_plan
    from paraplan.profiling.profile_file import read_profile
    from paraplan.simulator.predict import simulate_plan

    spec, cluster, p = measure.measure(zoo.build("gpt2-tiny")), load_cluster("local"), read_plan(plan)
    with_profile, without = profile_cost_model(spec, cluster, read_profile(profile)), analytic_cost_model(spec, cluster)
    measured = simulate_plan(p, with_profile).prediction.iteration_s
    assert json.loads(res.stdout)["iteration_s"] == pytest.approx(measured, rel=1e-9)
    # the layers' compute is the profile's, not the device model's (the iteration alone can coincide
    # within 0.1%: on the calibrated `local` the runtime's overheads are most of a tiny model's step)
    forward = [[float(c.compute(0).forward[i](4)) for i in range(spec.n_layers)] for c in (with_profile, without)]
    assert forward[0] != pytest.approx(forward[1], rel=1e-3)
    lenet = tmp_path / "lenet.json"
    assert run_cli_here(capsys, "profile", "lenet-5", "--batch-sizes", "2", "--repeats", "1", "--warmup", "0", "--no-checks",
                "--out", str(lenet)).returncode == 0
    res = run_cli_here(capsys, "simulate", plan, "--profile", str(lenet))
    assert res.returncode == 2 and "measured for 'lenet-5', not 'gpt2-tiny'" in res.stderr
