"""Issue 33: this machine measured once, then always used. The cache is made once, reused, keyed
(another key makes another entry), locked against a second maker, never the user's own (the suite's
conftest points XDG_CACHE_HOME at a directory of this run, with the calibration committed in
tests/fixtures), and every printed prediction and plan file names its cost source."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from conftest import run_cli_here

from paraplan.profiling import calibration_cache as cache

FIXTURE = Path(__file__).parents[1] / "fixtures" / "local-calibrated.toml"


def test_the_suite_never_reads_a_users_cache():
    home_cache = Path.home() / ".cache"
    assert os.environ["XDG_CACHE_HOME"] and not Path(os.environ["XDG_CACHE_HOME"]).samefile(home_cache) \
        if home_cache.exists() else True
    assert cache.cache_dir() == Path(os.environ["XDG_CACHE_HOME"]) / "paraplan"
    assert cache.entry_path(cache.machine_key(), "fp32").is_file()  # conftest's fixture


def _fake_make(counter: Path, seconds: float = 0.0):
    def make(path: Path) -> None:
        time.sleep(seconds)
        with open(counter, "a") as f:
            f.write("made\n")
        path.write_text(FIXTURE.read_text())
    return make


def test_made_once_then_reused_and_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    counter = tmp_path / "made.txt"
    key = {**cache.machine_key(), "cpu": "a test CPU"}
    first = cache.cached("fp32", _fake_make(counter), key=key)
    again = cache.cached("fp32", _fake_make(counter), key=key)
    assert first.made and not again.made and first.path == again.path
    assert counter.read_text().count("made") == 1
    assert json.loads(first.path.with_suffix(".key.json").read_text())["cpu"] == "a test CPU"
    # another CPU, core count, torch, thread setting or precision: another entry, made again
    for changed, precision in (({"cores": key["cores"] + 1}, "fp32"), ({"torch": "0.0"}, "fp32"),
                               ({"threads": {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": ""}}, "fp32"),
                               ({}, "bf16")):
        other = cache.cached(precision, _fake_make(counter), key={**key, **changed})
        assert other.made and other.path != first.path
    assert counter.read_text().count("made") == 5
    # the API measures only when asked
    assert cache.cached("fp32", _fake_make(counter), key={**key, "cpu": "never seen"}, allowed=False) is None


def _race(cache_home: str, counter: str, key: dict, results) -> None:
    os.environ["XDG_CACHE_HOME"] = cache_home
    found = cache.cached("fp32", _fake_make(Path(counter), seconds=1.0), key=key)
    results.put(found.made)


def test_two_processes_that_find_no_cache_make_one_calibration(tmp_path):
    key = {**cache.machine_key(), "cpu": "raced CPU"}
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "cache"), str(tmp_path / "made.txt"), key, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    made = sorted(results.get(timeout=5) for _ in procs)
    assert made == [False, True]  # the second waited on the lock and found the first's
    assert (tmp_path / "made.txt").read_text().count("made") == 1


def test_calibrate_replaces_the_cached_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bf16 = cache.entry_path(cache.machine_key(), "bf16")
    bf16.parent.mkdir(parents=True)
    bf16.write_text("measured against the previous fp32 entry")
    path = cache.store(FIXTURE)
    assert path == cache.entry_path(cache.machine_key(), "fp32") and path.read_text() == FIXTURE.read_text()
    assert not bf16.exists()


def test_a_prediction_names_its_cost_source_in_its_line_and_its_plan_file(tmp_path, capsys):
    out = tmp_path / "plan.json"
    res = run_cli_here(capsys, "plan", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--planner",
                       "csimd", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "costs: this machine, calibrated on " in res.stdout
    assert json.loads(out.read_text())["prediction"]["cost_source"].startswith("this machine, calibrated on ")
    analytic = run_cli_here(capsys, "plan", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--planner",
                            "csimd", "--out", str(out), "--no-calibration")
    assert "costs: analytic preset local (this machine never measured): absolute times are estimates" in \
        analytic.stdout.replace("\n", " ")
    assert json.loads(out.read_text())["prediction"]["cost_source"] == "analytic preset local (this machine never measured)"
    sim = run_cli_here(capsys, "simulate", str(out))
    assert "costs: this machine, calibrated on " in sim.stdout  # simulate uses the cache for the plan's `local`
    preset = run_cli_here(capsys, "plan", "--model", "lenet-5", "--cluster", "galvatron-8xtitan", "--batch", "8",
                          "--planner", "csimd", "--out", str(out))
    assert "costs: analytic preset galvatron-8xtitan (published figures" in preset.stdout.replace("\n", " ")


def test_drift_is_one_line_with_the_load_and_what_to_do():
    from paraplan.cli.train import drift_warning

    assert drift_warning(0.2, "this machine, calibrated on 2026-11-26") is None
    line = drift_warning(0.66, "analytic preset local (this machine never measured)")
    assert line.count("\n") == 0 and "measured 1.66x the prediction (+66%)" in line and "load average was" in line
    assert "run `paraplan calibrate`" in line
    assert "measures it again" in drift_warning(-0.4, "this machine, calibrated on 2026-11-26 10:00 UTC")
