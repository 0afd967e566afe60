"""Distributed runs on several gloo processes, each compared with a single-process run of the same
model, data and seed: losses and every updated parameter after 3 steps within 1e-5 relative."""

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from paraplan_process import run_paraplan, start_paraplan

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import write_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.launcher.launch import spawn
from paraplan.runtime.measure.reference import reference_run

from .many import train_many

GPT2_2 = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=4, schedule="1f1b",
              grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
GPT2_4 = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=4, schedule="1f1b",
              grad_sync="none", stages=tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in
                                             enumerate([(0, 2), (2, 3), (3, 4), (4, 6)])))
# 2 replicas x 2 stages: GroPipe's shape (stage s of replica r on device s + 2r)
LENET_2X2 = Plan(model="lenet-5", cluster="local", n_layers=5, global_batch=16, n_micro=4, schedule="1f1b",
                 grad_sync="gropipe-delayed",
                 stages=(Stage(LayerRange(0, 2), (0, 2)), Stage(LayerRange(2, 5), (1, 3))))


# every correctness case of this module: (plan, ranks, TrainConfig options); they train in three
# launches of the ranks (tests/distributed/many.py), not eleven
CASES = {
    "gpt2-2-gpipe": (replace(GPT2_2, schedule="gpipe"), 2, {}),
    "gpt2-2-1f1b": (replace(GPT2_2, schedule="1f1b"), 2, {}),
    "gpt2-4": (GPT2_4, 4, {}),
    **{f"lenet-2x2-{sync}-{schedule}": (replace(LENET_2X2, schedule=schedule, grad_sync=sync), 4, {})
       for sync in ("gropipe-delayed", "after-backward", "bucketed") for schedule in ("gpipe", "1f1b")},
    "vgg-2": (Plan(model="vgg-tiny", cluster="local", n_layers=16, global_batch=8, n_micro=2, schedule="1f1b",
                   grad_sync="none", stages=(Stage(LayerRange(0, 8), (0,)), Stage(LayerRange(8, 16), (1,)))), 2, {}),
    "gpt2-dp2": (Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=2, schedule="gpipe",
                      grad_sync="gropipe-delayed", stages=(Stage(LayerRange(0, 6), (0, 1)),)), 2, {}),
    "lenet-2x2-clipped": (replace(LENET_2X2, schedule="gpipe", grad_sync="after-backward"), 4, {"clip_norm": 0.01}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    configs = {name: TrainConfig(plan=plan, model=plan.model, steps=3, out_dir=str(root / name), dropout=False,
                                 optimizer="sgd", lr=0.1, **kw) for name, (plan, _, kw) in CASES.items()}
    for name in configs:
        (root / name).mkdir()
    # one launch per world size (GPT-2 on 4 stages first: its middle stages hold no tied weight, and
    # until every rank made every tied weight's group the 2 x 2 plans' groups made after it hung)
    launches = [["gpt2-2-gpipe", "gpt2-2-1f1b", "vgg-2", "gpt2-dp2"],
                ["gpt2-4", *(name for name in CASES if name.startswith("lenet-2x2"))]]
    assert sorted(sum(launches, [])) == sorted(CASES)
    for names in launches:
        train_many([configs[name] for name in names], CASES[names[0]][1])
    return configs


def _check_against_one_process(config):
    out = Path(config.out_dir)
    losses = json.loads((out / "losses.json").read_text())
    ref_losses, ref_params = reference_run(config)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = set()
    for s in range(config.plan.n_stages):
        for name, value in torch.load(out / f"stage{s}.pt").items():
            ref = ref_params[name]
            assert float((value - ref).norm() / ref.norm().clamp_min(1e-12)) < 1e-5, name
            seen.add(name)
    assert seen == set(ref_params)  # every parameter of the model was checked


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stage_gpt2_with_tied_embedding_matches_one_process(runs, schedule):
    _check_against_one_process(runs[f"gpt2-2-{schedule}"])


def test_four_stage_gpt2_matches_one_process(runs):
    _check_against_one_process(runs["gpt2-4"])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("sync", ["gropipe-delayed", "after-backward", "bucketed"])
def test_pipeline_times_data_parallel_matches_one_process(runs, schedule, sync):
    _check_against_one_process(runs[f"lenet-2x2-{sync}-{schedule}"])


def test_two_stage_cnn_matches_one_process(runs):
    _check_against_one_process(runs["vgg-2"])


def test_data_parallel_gpt2_matches_one_process(runs):
    _check_against_one_process(runs["gpt2-dp2"])


def test_gradient_clipping_across_stages(runs):
    config = runs["lenet-2x2-clipped"]
    assert config.clip_norm == 0.01
    _check_against_one_process(config)


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


@pytest.mark.parametrize("change,needle", [
    ({"nproc": "3"}, "the world has 3 ranks"),
    ({"model": "lenet-5"}, "the model has 5"),
])
def test_train_refuses_plans_that_do_not_fit(tmp_path, change, needle):
    plan_path = tmp_path / "plan.json"
    write_plan(GPT2_2, plan_path)
    args = ["train", "--plan", str(plan_path)]
    for k, v in change.items():
        args += [f"--{k}", v]
    res = run_paraplan(*args, env=ENV, timeout=120)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def _train(plan_path, *extra, env=None, timeout=180):
    args = ["train", "--plan", str(plan_path), "--no-dropout", "--optimizer", "sgd", "--lr", "0.1", *extra]
    return run_paraplan(*args, env={**ENV, **(env or {})}, timeout=timeout)


def test_checkpoint_and_resume_give_the_same_losses(tmp_path):
    """4 steps at once against 2, a checkpoint, and 2 more resumed from it. Through the Python API
    (the same launch_checked as `paraplan train`; its ranks fork from this process's warm
    forkserver): test_checkpoint_safety.py resumes with the command line's --checkpoint-dir --resume."""
    import paraplan

    options = dict(dropout=False, optimizer="sgd", lr=0.1)
    whole = paraplan.train(GPT2_2, steps=4, out_dir=tmp_path / "a", **options)
    paraplan.train(GPT2_2, steps=2, out_dir=tmp_path / "b", checkpoint_dir=str(tmp_path / "ck"), **options)
    rest = paraplan.train(GPT2_2, steps=4, out_dir=tmp_path / "c", checkpoint_dir=str(tmp_path / "ck"), resume=True,
                          **options)
    a = json.loads((tmp_path / "a" / "losses.json").read_text())
    c = json.loads((tmp_path / "c" / "losses.json").read_text())
    assert a == whole["losses"] and c == rest["losses"]
    assert len(a) == len(c) == 4 and c == pytest.approx(a, rel=1e-7)


def test_a_dead_rank_stops_the_run_with_a_clear_error(tmp_path):
    import time

    from paraplan.errors import ParaplanError

    from .faults import rank1_dies_at_step2

    config = TrainConfig(plan=GPT2_2, model="gpt2-tiny", steps=4, timeout_s=20, out_dir=str(tmp_path),
                         step_hook=rank1_dies_at_step2)
    t0 = time.time()
    with pytest.raises(ParaplanError, match="rank 1 exited with code 17") as caught:
        spawn(config, 2)
    assert "\n" not in str(caught.value)
    assert time.time() - t0 < 90


def test_compare_writes_both_timelines_and_the_error(tmp_path):
    plan_path = tmp_path / "plan.json"
    write_plan(GPT2_2, plan_path)
    res = _train(plan_path, "--steps", "3", "--compare", "--out-dir", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert "predicted" in res.stdout and re.search(r"measured \d+\.\d\dx the prediction \([+-]\d+%\)", res.stdout)
    run = tmp_path / "run"
    assert (run / "compare.png").read_bytes()[:4] == b"\x89PNG"
    measured = json.loads((run / "measured.trace.json").read_text())["traceEvents"]
    kinds = {e["cat"] for e in measured if e.get("ph") == "X"}
    assert {"forward", "backward"} <= kinds
    assert {e["pid"] for e in measured if e.get("ph") == "X"} == {0, 1}
    assert json.loads((run / "simulated.trace.json").read_text())["traceEvents"]


def _children(pid: int) -> list[int]:
    """Processes whose parent is pid (from /proc, Linux)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads processes from /proc")
def test_ranks_die_with_their_launcher_and_keep_their_losses(tmp_path):
    """One launcher killed with SIGTERM, another with SIGKILL; both run at once. Each launcher is a
    `paraplan train` forked from the warm process (tests/paraplan_process.py: start_paraplan), its
    ranks' forkserver its own child as a fresh one would be."""
    # was: both ranks trained on as orphans for minutes after the launcher was killed
    import signal
    import time

    plan_path = tmp_path / "plan.json"
    write_plan(GPT2_2, plan_path)
    runs = {sig: tmp_path / f"run-{sig}" for sig in ("SIGTERM", "SIGKILL")}
    procs = {sig: start_paraplan("train", "--plan", plan_path, "--steps", "100000", "--out-dir", run, env=ENV)
             for sig, run in runs.items()}
    ranks, done = {}, {}
    try:
        deadline = time.time() + 180
        for sig, proc in procs.items():
            run = runs[sig]
            while not ((run / "losses.json").exists() and json.loads((run / "losses.json").read_text())):
                assert proc.poll() is None and time.time() < deadline, proc.wait(1).stderr if proc.poll() else "timeout"
                time.sleep(0.5)
            ranks[sig] = _children(proc.pid)
            assert ranks[sig], "no rank processes found"
            os.kill(proc.pid, getattr(signal, sig))
        for sig, proc in procs.items():
            done[sig] = proc.wait(timeout=60)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
    errors = {sig: d.stderr for sig, d in done.items()}
    assert done["SIGTERM"].returncode == 143 and errors["SIGTERM"].strip() == "paraplan: terminated", errors
    for sig in procs:
        deadline = time.time() + 30
        while any(_alive(p) for p in ranks[sig]) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in ranks[sig]), f"ranks still running after {sig}"
        assert len(json.loads((runs[sig] / "losses.json").read_text())) >= 1  # the completed steps' losses are kept
