"""The command line: real subprocesses, one-line errors with exit status 2."""

import json
import os

import pytest
from paraplan_process import run_paraplan

from paraplan.models import zoo

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def run(*args, timeout=120):
    return run_paraplan(*args, env=ENV,
                          timeout=timeout)


def test_models_lists_the_whole_zoo():
    """One `paraplan models --json` (it builds every zoo entry on meta, seconds) for all that is asked
    of it: the whole zoo, layer and parameter counts, each entry's planned size (the input note's
    "the zoo's setting"), and its JSON keys (tests/unit/test_json_schemas.py's schema rule)."""
    out = run("models", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["model"]: r for r in json.loads(out.stdout)}
    assert set(rows) == set(zoo.names())
    assert all(set(r) == {"family", "layers", "model", "parameters", "size", "source"} for r in rows.values())
    assert rows["gpt3-175b"]["layers"] == 98
    assert abs(rows["gpt2-xl"]["parameters"] - 1.56e9) / 1.56e9 < 0.01
    sizes = {name: r["size"] for name, r in rows.items()}
    assert sizes["llama2-7b"] == "32" and sizes["vit-huge-32"] == "224x224" and sizes["t5-512-4-32"] == "512/4"
    assert sizes["llama3.1-8b"] == sizes["llama3.1-70b"] == sizes["llama3.1-405b"] == "8192"


def test_clusters_lists_the_presets():
    out = run("clusters")
    assert out.returncode == 0, out.stderr
    for name in ("csimd-v100-1gbe", "gropipe-8xt4", "galvatron-64xa100", "bipartition-7vm", "local"):
        assert name in out.stdout


def test_inspect_prints_the_layer_table():
    out = run("inspect", "gpt2-tiny", "--batch", "4", "--cluster", "local", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [layer["name"] for layer in data["layers"]] == ["embedding", "block0", "block1", "block2", "block3", "head"]
    assert all(layer["forward_s"] > 0 for layer in data["layers"])
    table = run("inspect", "lenet-5", "--batch", "8")
    assert table.returncode == 0 and "conv1" in table.stdout and "total" in table.stdout


@pytest.mark.parametrize("args,needle", [
    (("inspect", "gpt5-huge"), "unknown model 'gpt5-huge'"),
    (("inspect", "gpt2-tiny", "--cluster", "nowhere"), "unknown cluster 'nowhere'"),
    (("inspect", "gpt2-tiny", "--batch", "0"), "--batch must be positive"),
    (("inspect", "gpt2-tiny", "--batch", "-3"), "--batch must be positive"),
    (("inspect", "gpt2-tiny", "--seq-len", "0"), "--seq-len: must be a positive whole number, got 0"),
    (("inspect", "gpt2-tiny", "--batch", "many"), "invalid int value"),
    (("inspect", "gpt2-tiny", "--device", "9", "--cluster", "gropipe-8xt4"), "devices 0..7"),
    (("frobnicate",), "invalid choice"),
])
def test_bad_input_is_one_line_and_status_2(args, needle):
    out = run(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_malformed_cluster_file(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("format_version = 1\nname = [\n")
    out = run("inspect", "gpt2-tiny", "--cluster", str(bad))
    assert out.returncode == 2 and "malformed TOML" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_simulate_writes_gantt_trace_and_prediction(tmp_path):
    gantt, trace, out = tmp_path / "g.png", tmp_path / "t.json", tmp_path / "p.json"
    res = run("simulate", os.path.join(EXAMPLES, "gpt2-xl-1f1b-4x8.json"), "--gantt", str(gantt), "--trace", str(trace),
              "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["feasible"] and summary["iteration_s"] > 0 and 0 < summary["bubble_fraction"] < 1
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"X", "M"}
    assert {e["cat"] for e in events if e["ph"] == "X"} >= {"forward", "backward", "send_forward", "send_backward"}
    saved = json.loads(out.read_text())
    assert saved["prediction"]["iteration_s"] == pytest.approx(summary["iteration_s"])


def test_simulate_reports_out_of_memory():
    res = run("simulate", os.path.join(EXAMPLES, "bert-huge-32-dp8.json"), "--memory-gib", "12", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert not summary["feasible"] and "out of memory" in summary["reason"]


@pytest.mark.parametrize("content,needle", [
    ("{", "malformed JSON"),
    ('{"format_version": 1, "model": "gpt2-xl"}', "cluster: missing"),
])
def test_simulate_bad_plan_files(tmp_path, content, needle):
    path = tmp_path / "plan.json"
    path.write_text(content)
    res = run("simulate", str(path))
    assert res.returncode == 2 and needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_simulate_plan_that_does_not_fit_the_cluster(tmp_path):
    data = json.loads(open(os.path.join(EXAMPLES, "gpt2-xl-gpipe-4x8.json")).read())
    data["stages"][3]["devices"] = [11]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    res = run("simulate", str(path))
    assert res.returncode == 2 and "uses device 11" in res.stderr
    gantt = tmp_path / "g.png"
    res = run("simulate", str(path), "--gantt", str(gantt))
    assert not gantt.exists()


def test_bare_paraplan_prints_help_and_version():
    bare = run()
    assert bare.returncode == 0 and "plan" in bare.stdout and "simulate" in bare.stdout, bare.stderr
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("paraplan ")


def test_usage_errors_have_one_prefix():
    # was "paraplan: error: paraplan plan: ..."
    res = run("plan", "--model", "lenet-5")
    assert res.returncode == 2
    assert res.stderr.strip().startswith("paraplan: error: plan: the following arguments are required")
    assert res.stderr.count("paraplan") == 1 and len(res.stderr.strip().splitlines()) == 1


def test_written_files_respect_the_umask(tmp_path):
    # atomic writes went through mkstemp, which left every plan, trace and profile 0600
    from paraplan.system.fileio import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "x.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644


def test_one_stage_is_singular(tmp_path):
    res = run("plan", "--planner", "csimd", "--model", "lenet-5", "--cluster", "local", "--batch", "8", "--stages",
              "1", "--micro-batches", "1", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 0, res.stderr
    assert "1 stage [" in res.stdout and "1 micro-batch;" in res.stdout


def test_fewer_stages_than_asked_are_explained_and_exact_stages_forces_them(tmp_path):
    """The README's own example: VGG-16 over 1 GbE runs faster on one device; the planner says so."""
    args = ("plan", "--planner", "csimd", "--model", "vgg-16", "--cluster", "csimd-v100-1gbe", "--batch", "64",
            "--stages", "4", "--out", str(tmp_path / "p.json"))
    out = run(*args)
    assert out.returncode == 0, out.stderr
    assert "1 stage on 1 of 8 devices" in out.stdout and "--exact-stages forces 4" in out.stdout
    out = run(*args, "--exact-stages", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n_stages"] == 4
    out = run("plan", "--planner", "csimd", "--model", "vgg-16", "--cluster", "csimd-v100-1gbe", "--batch", "64",
              "--exact-stages")
    assert out.returncode == 2 and "--exact-stages needs --stages" in out.stderr


def test_galvatron_plans_the_largest_batch_and_prints_its_strategies(tmp_path):
    out = run("plan", "--planner", "galvatron-bmw", "--model", "bert-tiny", "--cluster", "galvatron-8xtitan",
              "--memory", "1GiB", "--batch", "max", "--out", str(tmp_path / "g.json"))
    assert out.returncode == 0, out.stderr
    assert "stage 1, layers 0-" in out.stdout and "global batch" in out.stdout
    plan = json.loads((tmp_path / "g.json").read_text())
    assert plan["global_batch"] >= 8 and all("strategies" in s for s in plan["stages"])
    out = run("plan", "--planner", "csimd", "--model", "bert-tiny", "--cluster", "local", "--batch", "max")
    assert out.returncode == 2 and "plans a given batch" in out.stderr
    out = run("plan", "--planner", "galvatron-bmw", "--model", "bert-tiny", "--cluster", "local", "--batch", "8",
              "--memory", "16 parsecs")
    assert out.returncode == 2 and "expected a size" in out.stderr
