"""`paraplan plan` with CSIMD and the baselines: valid Plans whose simulation equals eq. (8)."""

import json
import os

import pytest
from paraplan_process import run_paraplan

from paraplan.costs.model import analytic_cost_model
from paraplan.errors import ParaplanError
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.planners.pipeline_split import DIVIDERS, build_problem, plan_split
from paraplan.planners.registry import planner_names
from paraplan.plans.plan import validate
from paraplan.simulator.predict import simulate_plan

planner_names()  # loads every planner, the split planners among them (pipeline_split.DIVIDERS)
PLANNERS = tuple(DIVIDERS)


@pytest.fixture(scope="module")
def vgg():
    spec = measure.measure(zoo.build("vgg-16"))
    return spec, analytic_cost_model(spec, load_cluster("csimd-v100-10gbe"))


@pytest.mark.parametrize("planner", [p for p in PLANNERS if p != "brute-force"])
def test_every_planner_gives_a_plan_the_simulator_agrees_with(vgg, planner):
    spec, cm = vgg
    plan = validate(plan_split(cm, "vgg-16", "csimd-v100-10gbe", 64, planner, n_stages=4))
    assert plan.n_stages <= 4 and plan.schedule == "gpipe" and 64 % plan.n_micro == 0
    sim = simulate_plan(plan, cm)
    eq8 = dict(plan.search.options)["eq8_time_s"]
    assert sim.prediction.iteration_s == pytest.approx(eq8, rel=1e-9)


def test_csimd_beats_or_ties_every_baseline_on_a_real_model(vgg):
    spec, cm = vgg
    times = {p: dict(plan_split(cm, "vgg-16", "x", 64, p, n_stages=4).search.options)["eq8_time_s"]
             for p in PLANNERS if p != "brute-force"}
    for p in (1, 4, 64):
        times[f"even-{p}"] = dict(plan_split(cm, "vgg-16", "x", 64, "even", n_stages=4, n_micro=p)
                                  .search.options)["eq8_time_s"]
    assert times["csimd"] <= min(times.values()) * (1 + 1e-9)


def test_brute_force_matches_csimd_on_a_small_model():
    spec = measure.measure(zoo.build("csimd-cnn-8"))
    cm = analytic_cost_model(spec, load_cluster("csimd-v100-1gbe"))
    bf = plan_split(cm, "csimd-cnn-8", "x", 64, "brute-force", n_stages=4)
    cs = plan_split(cm, "csimd-cnn-8", "x", 64, "csimd", n_stages=4)
    assert dict(cs.search.options)["eq8_time_s"] <= dict(bf.search.options)["eq8_time_s"] * (1 + 1e-9)


def test_bad_requests(vgg):
    spec, cm = vgg
    with pytest.raises(ParaplanError, match="unknown planner"):
        plan_split(cm, "vgg-16", "x", 64, "magic")
    with pytest.raises(ParaplanError, match="does not divide the batch 64"):
        plan_split(cm, "vgg-16", "x", 64, "even", n_micro=5)
    with pytest.raises(ParaplanError, match="^stages: need 1..8"):
        build_problem(cm, 64, 9)
    big = measure.measure(zoo.build("gpt2-large"))
    with pytest.raises(ParaplanError, match="at most 30 layers"):
        plan_split(analytic_cost_model(big, load_cluster("csimd-v100-1gbe")), "gpt2-large", "x", 8, "brute-force")


ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _cli(*args):
    return run_paraplan(*args, env=ENV,
                          timeout=300)


def test_plan_cli_writes_a_plan_and_a_summary(tmp_path):
    out = tmp_path / "plan.json"
    res = _cli("plan", "--model", "gpt2-xl", "--cluster", "csimd-v100-10gbe", "--batch", "64", "--planner", "csimd",
               "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    saved = json.loads(out.read_text())
    assert saved["search"]["planner"] == "csimd" and saved["prediction"]["feasible"]
    assert summary["prediction"]["iteration_s"] == pytest.approx(summary["search"]["options"]["eq8_time_s"])
    res = _cli("simulate", str(out), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["iteration_s"] == pytest.approx(
        summary["prediction"]["iteration_s"])


def test_a_measured_profile_drives_the_planner(tmp_path):
    profile = tmp_path / "p.json"
    assert _cli("profile", "gpt2-tiny", "--batch-sizes", "1,2,4,8", "--repeats", "2", "--warmup", "1", "--no-checks",
                "--out", str(profile)).returncode == 0
    out = tmp_path / "plan.json"
    res = _cli("plan", "--planner", "csimd", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8",
               "--profile", str(profile), "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["search"]["options"]["costs"].startswith("profile ")


@pytest.mark.parametrize("args,needle", [
    (("--planner", "magic"), "unknown planner 'magic'"),
    (("--batch", "0"), "--batch: must be a positive whole number"),
    (("--stages", "0"), "--stages: must be positive"),
    (("--micro-batches", "7"), "does not divide the batch 64"),
])
def test_plan_cli_bad_input(tmp_path, args, needle):
    base = {"--planner": "csimd", "--model": "vgg-16", "--cluster": "csimd-v100-1gbe", "--batch": "64", "--out": str(tmp_path / "p.json")}
    flat = []
    for k, v in base.items():
        if k not in args:
            flat += [k, v]
    res = _cli("plan", *flat, *args)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()
