"""Checks before the work (issue 12, points 5 and 6): outputs, checkpoints, names and arguments are
refused in one line before anything is measured, planned or trained; every option has help and
shows its default; unknown names list close matches only; train writes under ./runs/ by default;
`make bench` leaves the committed results/ alone; compare.png says what it draws."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from paraplan_process import refused, run_paraplan

from paraplan.errors import UnknownNameError
from paraplan.plans.plan_file import read_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.state.checkpoints import check_resume, checkpoint_record, write_manifest
from paraplan.system.fileio import make_dirs, output_problem, remove_if_empty

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
LOCAL_PLAN = EXAMPLES / "gpt2-tiny-local-1f1b-2x4.json"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def run(*args, cwd=None, env=None, timeout=60):
    return run_paraplan(*args, env={**ENV, **(env or {})}, cwd=cwd, timeout=timeout)


# --- 5. outputs are checked before any work --------------------------------------------------

@pytest.mark.parametrize("args,needles", [
    # the model does not exist either: the output is refused first, before the model is even looked up
    (("plan", "--model", "no-such-model", "--cluster", "local", "--batch", "8", "--out", "{tmp}/missing/p.json"),
     ("--out: directory {tmp}/missing does not exist",)),
    (("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--out", "{tmp}"),
     ("--out:", "is a directory")),
    (("simulate", str(LOCAL_PLAN), "--gantt", "{tmp}/g.txt"), ("--gantt:", "'.txt' is not a figure format", ".png", ".svg")),
    (("simulate", str(LOCAL_PLAN), "--gantt", "{tmp}/g"), ("--gantt:", "no extension")),
    (("simulate", str(LOCAL_PLAN), "--trace", "{tmp}/missing/t.json"), ("--trace: directory {tmp}/missing",)),
    (("simulate", str(LOCAL_PLAN), "--out", "{tmp}/missing/p.json"), ("--out: directory {tmp}/missing",)),
    (("train", "--plan", str(LOCAL_PLAN), "--out-dir", "{tmp}/file/run"), ("--out-dir:", "is not a directory")),
    (("train", "--plan", str(LOCAL_PLAN), "--checkpoint-dir", "{tmp}/file"), ("--checkpoint-dir:", "not a directory")),
    (("profile", "no-such-model", "--out", "{tmp}/missing/p.json"), ("--out: directory {tmp}/missing",)),
    (("profile-links", "--out", "{tmp}/missing/c.toml"), ("--out: directory {tmp}/missing",)),
])
def test_outputs_are_checked_before_the_work(tmp_path, args, needles):
    # a missing directory of the test's own: an absolute /nonexistent is created by any root process
    # that writes there, and a concurrent run then found it
    (tmp_path / "file").write_text("not a directory")
    res = run(*(a.replace("{tmp}", str(tmp_path)) for a in args), cwd=tmp_path)
    refused(res, *(n.replace("{tmp}", str(tmp_path)) for n in needles))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written, no directory made


def test_output_problem(tmp_path):
    assert output_problem("p.json") is None
    assert "does not exist" in output_problem(str(tmp_path / "missing" / "p.json"))
    assert "is a directory" in output_problem("/")
    assert output_problem(str(tmp_path / "missing" / "a" / "b"), directory=True) is None  # created on demand
    assert "is not a directory" in output_problem(__file__ + "/x", directory=True)
    assert "exists and is not a directory" in output_problem(__file__, directory=True)


def test_gantt_accepts_any_matplotlib_format(tmp_path):
    res = run("simulate", LOCAL_PLAN, "--gantt", tmp_path / "g.svg")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")


# --- 5. plan: cheap argument checks before the measurement -----------------------------------

@pytest.mark.parametrize("extra,needle", [
    (("--planner", "even", "--eta", "3"), "--eta: planner 'even' has no such option"),
    (("--planner", "csimd", "--eta", "0"), "--eta: must be a whole number of at least"),
    (("--planner", "nope"), "unknown planner 'nope'"),
])
def test_plan_argument_checks_come_before_the_measurement(tmp_path, extra, needle):
    # a profile that does not exist is read after the model is measured: if the argument check came
    # after the measurement, the error would be about the profile
    res = run("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--profile",
              tmp_path / "missing.json", "--out", tmp_path / "p.json", *extra)
    refused(res, needle)


# --- 5. train: --compare's cluster, resume checks, no stray directories ----------------------

def _plan_on(tmp_path, cluster: str) -> Path:
    data = json.loads(LOCAL_PLAN.read_text())
    data["cluster"] = cluster
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_train_compare_uses_the_plans_cluster_and_checks_it_first(tmp_path):
    assert __import__("paraplan.cli").cli.build_parser().parse_args(["train", "--plan", "p.json"]).cluster is None
    # the plan's cluster by default, as simulate: one that does not exist is refused before the run
    res = run("train", "--plan", _plan_on(tmp_path, "no-such-cluster"), "--compare", "--out-dir", tmp_path / "run",
              cwd=tmp_path)
    refused(res, "unknown cluster 'no-such-cluster'")
    # an explicit --cluster still wins, and is checked before the run too
    res = run("train", "--plan", LOCAL_PLAN, "--compare", "--cluster", "nowhere-at-all", "--out-dir",
              tmp_path / "run", cwd=tmp_path)
    refused(res, "unknown cluster 'nowhere-at-all'")
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_refused_train_runs_leave_no_directories(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for extra in ((), ("--out-dir", tmp_path / "a" / "b", "--checkpoint-dir", tmp_path / "c" / "d")):
        res = run("train", "--plan", LOCAL_PLAN, "--nproc", "3", *extra, cwd=tmp_path, env={"TMPDIR": str(scratch)})
        refused(res, "--nproc")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]
    assert [p.name for p in scratch.iterdir() if "paraplan" in p.name] == []  # (torch keeps its own caches there)


def test_make_dirs_and_remove_if_empty(tmp_path):
    created = make_dirs(tmp_path / "a" / "b" / "c")
    assert created == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert make_dirs(tmp_path / "a" / "b") == []
    remove_if_empty(created)
    assert list(tmp_path.iterdir()) == []
    created = make_dirs(tmp_path / "x" / "y")
    (tmp_path / "x" / "y" / "losses.json").write_text("[]")
    remove_if_empty(created)  # something was written: everything stays
    assert (tmp_path / "x" / "y" / "losses.json").exists()


def test_default_run_dir_is_a_timestamp_under_runs(tmp_path, monkeypatch):
    from paraplan.runtime.launcher.launch import default_run_dir

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    first = default_run_dir(tmp_path / "runs")
    assert first.parent == tmp_path / "runs" and re.fullmatch(r"\d{8}-\d{6}", first.name)
    assert not first.exists()  # not created until the run starts
    first.mkdir(parents=True)
    second = default_run_dir(tmp_path / "runs")
    assert second != first and second.name.startswith(first.name[:8])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29512")
    assert default_run_dir(tmp_path / "runs") == tmp_path / "runs" / "torchrun-29512"  # every rank agrees


def _config(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(plan=read_plan(LOCAL_PLAN), model="gpt2-tiny", steps=4, checkpoint_dir=str(tmp_path / "ck"),
                       resume=True, **kw)


def _save(config, step=2, **changes):
    """A checkpoint as the ranks leave it: DCP's files in step<N>/ (stand-ins: the check reads their
    sizes and sha256, not their contents), then the manifest (runtime/state/checkpoints.py)."""
    import hashlib

    directory = Path(config.checkpoint_dir)
    state = directory / f"step{step}"
    state.mkdir(parents=True, exist_ok=True)
    files = []
    for name, data in ((".metadata", b"metadata"), ("__0_0.distcp", b"rank 0"), ("__1_0.distcp", b"rank 1")):
        (state / name).write_bytes(data)
        files.append({"file": f"step{step}/{name}", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    write_manifest(directory, step, files, {**checkpoint_record(config), **changes}, [1.0] * step)


def test_resume_check_accepts_a_complete_checkpoint(tmp_path):
    config = _config(tmp_path)
    _save(config)
    assert check_resume(config) == 2


def _older_paraplan(config):
    (Path(config.checkpoint_dir) / "checkpoint.json").unlink()
    torch.save({"weights": 1}, Path(config.checkpoint_dir) / "stage0.pt")


@pytest.mark.parametrize("damage,needle", [
    (lambda c: (Path(c.checkpoint_dir) / "step2" / "__1_0.distcp").unlink(), "__1_0.distcp does not exist"),
    (lambda c: (Path(c.checkpoint_dir) / "step2" / "__1_0.distcp").write_bytes(b"rank 9"),
     "__1_0.distcp is damaged: its sha256"),
    (lambda c: (Path(c.checkpoint_dir) / "checkpoint.json").write_text("{"), "checkpoint.json: malformed JSON"),
    (_older_paraplan, "no checkpoint.json: a checkpoint of an older paraplan"),
    (lambda c: _save(c, model="lenet-5"), "checkpoint.json belongs to another model: 'lenet-5'"),
    (lambda c: _save(c, global_batch=64), "the checkpoint was written with global batch 64"),
])
def test_resume_check_names_the_bad_checkpoint(tmp_path, damage, needle):
    from paraplan.errors import FieldError

    config = _config(tmp_path)
    _save(config)
    damage(config)
    with pytest.raises(FieldError, match=re.escape(needle)) as info:
        check_resume(config)
    assert info.value.field == "resume" and "\n" not in str(info.value)


def test_train_resume_without_checkpoints_is_refused_before_the_ranks_start(tmp_path):
    (tmp_path / "ck").mkdir()
    res = run("train", "--plan", LOCAL_PLAN, "--checkpoint-dir", tmp_path / "ck", "--resume", "--out-dir",
              tmp_path / "run", timeout=30)  # it was "Connection closed by peer" after 45 s
    refused(res, "--resume:", "checkpoint.json does not exist: no checkpoint was written in")
    assert not (tmp_path / "run").exists()


# --- 6. help text and defaults ---------------------------------------------------------------

# the model-reference arguments are being reworked elsewhere (the lead's change); their help comes with it
MODEL_ARGUMENTS = {"model", "--model", "--module", "--seq-len", "--image-size"}


def _parsers():
    import argparse

    from paraplan.cli import build_parser

    parser = build_parser()
    yield "paraplan", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_has_help_and_shows_its_default():
    import argparse

    seen = 0
    for name, parser in _parsers():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = action.option_strings[-1] if action.option_strings else action.dest
            if not action.help and label in MODEL_ARGUMENTS:
                continue
            assert action.help and action.help.strip(), f"paraplan {name}: {label} has no help"
            seen += 1
            default = action.default
            if default is None or default is False or default is argparse.SUPPRESS:
                continue
            assert f"(default: {default})" in text or "%(default)" in action.help, \
                f"paraplan {name}: {label}'s default {default!r} is not in its help"
    assert seen > 50


# --- 6. unknown names: close matches only ----------------------------------------------------

def test_unknown_names_list_close_matches_only():
    names = ["bipartition", "brute-force", "csimd", "csimd-paper", "even", "gropipe", "params", "pipedream-dp",
             "pipedream-layerwise", "random", "time-1d"]
    close = str(UnknownNameError("planner", "csmid", names))
    assert "did you mean csimd" in close and "gropipe" not in close
    far = UnknownNameError("planner", "nope", names)
    assert far.close == [] and not any(n in str(far) for n in names)


@pytest.mark.parametrize("args,needle,absent", [
    (("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--planner", "nope"),
     "see `paraplan plan --help`", "pipedream-layerwise"),
    (("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--planner", "gropip"),
     "did you mean gropipe", "pipedream-layerwise"),
    (("inspect", "gpt2-tiny", "--cluster", "zzzz"), "see `paraplan clusters`", "galvatron"),
    (("inspect", "qqqqqq"), "see `paraplan models`", "gpt2-xl"),
])
def test_unknown_names_on_the_command_line(args, needle, absent):
    res = run(*args)
    refused(res, needle)
    assert absent not in res.stderr


# --- 6. make bench writes into an ignored folder ---------------------------------------------

def test_benchmarks_do_not_write_the_committed_results():
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        code = path.read_text()
        assert not re.search(r"""Path\(\s*["']results""", code), f"{path.name} writes results/ directly"
        if re.search(r"write_text|savefig|mkdir", code):
            assert '"PARAPLAN_BENCH_OUT", "bench-out"' in code, f"{path.name}: output root not bench-out/"
    make = (ROOT / "Makefile").read_text()
    bench = make.split("\nbench:")[1].split("\n\n")[0]
    assert "results" not in bench and "bench-out" in bench
    assert "\nresults:" in make
    assert "bench-out/" in (ROOT / ".gitignore").read_text().split()
    if shutil.which("make"):
        dry = subprocess.run(["make", "-n", "-C", str(ROOT), "bench"], capture_output=True, text=True, timeout=30)
        assert dry.returncode == 0 and "results" not in dry.stdout, dry.stdout


# --- 6. compare.png: a legend, one predicted number, the median step ---------------------------

def _fake_run(out: Path, step_times: list[float]) -> None:
    """Two ranks' timelines and step times, as a 2-stage 1F1B run of 4 micro-batches writes them."""
    for rank in range(2):
        events, t = [], 0.0
        for step, took in enumerate(step_times):
            slot = took / 10
            for m in range(4):
                for k, kind in enumerate(("forward", "backward")):
                    start = t + (2 * m + k + rank) * slot
                    events.append({"step": step, "lane": "compute", "kind": kind, "micro": m, "start": start,
                                   "end": start + 0.8 * slot})
            t += took + 0.01
        (out / f"timeline_rank{rank}.json").write_text(json.dumps({"rank": rank, "events": events}))
        (out / f"steps_rank{rank}.json").write_text(json.dumps(step_times))


def test_compare_png_draws_the_median_step_with_one_predicted_number(tmp_path, monkeypatch):
    import matplotlib.figure

    from paraplan.costs.model import analytic_cost_model
    from paraplan.hardware import load_cluster
    from paraplan.models import measure, zoo
    from paraplan.runtime.measure.compare import compare_run

    _fake_run(tmp_path, [0.30, 0.10, 0.12, 0.09, 0.11, 0.13])  # after the first: median 0.11, step 4
    seen = {}
    save = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        seen["titles"] = [ax.get_title() for ax in fig.axes]
        seen["suptitle"] = fig._suptitle.get_text() if fig._suptitle else ""
        seen["legends"] = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        seen["xmax"] = [max(line.get_xdata()[0] for line in ax.get_lines()) for ax in fig.axes]
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    plan = read_plan(LOCAL_PLAN)
    cm = analytic_cost_model(measure.measure(zoo.build("gpt2-tiny")), load_cluster("local"))
    c = compare_run(plan, cm, tmp_path)
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert c.measured_median_s == pytest.approx(0.11)
    measured, predicted = seen["titles"]
    assert "step 4" in measured and "110.0 ms" in measured and "median" in measured
    assert predicted == f"predicted: {c.predicted_s * 1e3:.1f} ms"
    # the one predicted number: no other figure of the prediction anywhere on the figure
    numbers = re.findall(r"(\d+\.\d) ms", " ".join([seen["suptitle"], measured, predicted]))
    assert set(numbers) == {"110.0", f"{c.predicted_s * 1e3:.1f}"}
    # each panel ends (its vertical line) at the number in its title
    assert seen["xmax"] == pytest.approx([0.11, c.predicted_s])
    assert {"forward", "backward", "all-reduce"} <= set(seen["legends"])
    assert "1 replica," in seen["suptitle"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where mkdir fails for everyone")
def test_an_output_directory_that_cannot_be_made_is_refused_before_any_work(tmp_path):
    """Permissions pass under /proc (root, or a mount that refuses mkdir); the check makes and
    removes a probe directory instead of trusting them. Was: a traceback after planning or launch,
    with the plan already written."""
    plan_out = tmp_path / "plan.json"
    res = run("plan", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8", "--report",
              "/proc/nonexistent/report", "--out", plan_out)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "--report: cannot create /proc/nonexistent/report" in res.stderr and not plan_out.exists()
    res = run("train", "--plan", LOCAL_PLAN, "--steps", "1", "--out-dir", "/proc/nonexistent/run")
    assert res.returncode == 2 and "--out-dir: cannot create /proc/nonexistent/run" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and list(tmp_path.iterdir()) == []  # no probe left behind


def test_make_dirs_that_fails_halfway_removes_what_it_made(tmp_path, monkeypatch):
    from paraplan.system.fileio import WriteError

    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name == "c":
            raise OSError(30, "Read-only file system")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(WriteError, match=r"cannot create the directory .*/a/b/c: Read-only file system"):
        make_dirs(tmp_path / "a" / "b" / "c" / "d")
    assert list(tmp_path.iterdir()) == []


def test_the_proof_says_when_splitting_cannot_pay_and_when_the_load_makes_it_meaningless():
    """Issue 48, item 7: the demo's proof says plainly when one process was the fastest measured,
    and gives the load average before the runs, saying when it was too high to mean much."""
    from types import SimpleNamespace

    from paraplan.cli.plan_runs import BUSY_LOAD, proof_verdict

    def run(name, seconds):
        return SimpleNamespace(name=name, median_s=seconds)

    split_loses = [run("chosen (dp)", 0.05), run("even split (2 stages)", 0.06), run("one process", 0.04)]
    lines = proof_verdict(split_loses, 0.3)
    assert lines[0] == "this machine cannot gain from splitting this model: one process was the fastest measured"
    assert lines[1].startswith("load average 0.30 on ") and "say little" not in lines[1]
    split_wins = [run("chosen (dp)", 0.03), run("one process", 0.04)]
    busy = proof_verdict(split_wins, BUSY_LOAD + 1)
    assert len(busy) == 1 and "say little about this machine idle" in busy[0]
    assert proof_verdict(split_wins, float("nan")) == []
