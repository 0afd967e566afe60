"""`--json` on every subcommand: one JSON document on stdout with a stable set of keys (a change to
any of them is a change of schema and must change this test). train and profile-links, which start
processes, are checked in tests/distributed/test_json_cli.py."""

import json
import os

import pytest
from paraplan_process import run_paraplan

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _json(*args) -> object:
    res = run_paraplan(*args, "--json", env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)  # the whole of stdout is the document


def test_clusters():
    # `models --json`'s keys: tests/unit/test_cli.py (one run of it for the suite)
    clusters = _json("clusters")
    assert all(set(c) == {"default_precision", "description", "device_types", "format_version", "name", "nodes"} for c in clusters)


def test_inspect():
    d = _json("inspect", "lenet-5")
    assert set(d) == {"batch", "cluster", "device", "family", "input_note", "inputs", "layers", "model", "parameters"}


def test_plan_with_one_planner_and_simulate(tmp_path):
    out = tmp_path / "p.json"
    d = _json("plan", "--planner", "csimd", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--out",
              str(out))
    # tokens/s, TFLOP/s and MFU per GPU and how the model's FLOPs were counted (costs/model_flops.py)
    per_gpu = {"tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_tflops_per_gpu", "model_flops"}
    assert set(d) == {"feasible", "input_note", "layers", "n_micro", "n_stages", "note", "operators_per_device", "out",
                      "planner", "prediction", "reason", "search", *per_gpu}
    s = _json("simulate", str(out))
    assert set(s) == {"bubble_fraction", "cost_source", "devices", "feasible", "input_note", "iteration_s", "memory",
                      "memory_at_peak", "precision", "reason", "throughput_samples_per_s", "time_split", *per_gpu}
    for doc in (d, s):  # lenet-5 reads images: no tokens; 3 x its measured forward FLOPs
        assert doc["tokens_per_s_per_gpu"] is None and doc["model_flops"]["tokens_per_sample"] is None
        assert doc["model_flops"]["formula"].startswith("3 x the measured forward FLOPs per sample")
        assert set(doc["model_flops"]) == {"per_sample", "per_token", "tokens_per_sample", "formula", "mfu_formula"}
        assert 0 < doc["mfu"] <= 1 and doc["tflops_per_gpu"] == pytest.approx(doc["mfu"] * doc["peak_tflops_per_gpu"])
    assert s["mfu"] == pytest.approx(d["mfu"], rel=1e-9)
    assert d["input_note"] == s["input_note"] and d["input_note"].startswith("image 32x32 (the zoo's setting")
    split = s["time_split"]  # the parts add up to the iteration (simulator/time_split.py)
    assert split["compute_s"] + split["exposed_comm_s"] + split["after_s"] + split["idle_s"] == \
        pytest.approx(s["iteration_s"], rel=1e-9)
    assert 0 <= split["exposed_sync_s"] <= split["exposed_comm_s"]
    assert s["cost_source"] == d["prediction"]["cost_source"]
    assert s["cost_source"].startswith("this machine, calibrated on ")  # the suite's cached calibration
    assert s["iteration_s"] == pytest.approx(d["prediction"]["iteration_s"], rel=1e-12)
    assert s["precision"] == "fp32"  # local's default
    peaks = {m["device"]: m["peak_bytes"] for m in s["memory"]}
    for row in s["memory_at_peak"]:
        assert sum(row["parts"].values()) == pytest.approx(row["peak_bytes"])
        assert round(row["peak_bytes"]) == peaks[row["devices"][0]]
    assert [r["peak_bytes"] for r in s["memory_at_peak"]] == sorted((r["peak_bytes"] for r in s["memory_at_peak"]),
                                                                    reverse=True)


def test_profile(tmp_path):
    d = _json("profile", "lenet-5", "--batch-sizes", "1,2", "--repeats", "2", "--warmup", "1", "--no-checks", "--out",
              str(tmp_path / "prof.json"))
    assert {"model", "layers", "device", "threads", "torch_version", "format_version"} <= set(d)
