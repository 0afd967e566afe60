"""Issue 53 item 5: training that carries on when a machine is lost (`paraplan train --elastic`,
cli/train_elastic.py, runtime/launcher/elastic.py). GPT-2 tiny without dropout, a fallback ladder
of pipelines over 4 gloo ranks (rung 0: 4 stages) and fewer (rung 1); a rank's process or a torchrun
"node" (its agent and workers) is killed with SIGKILL mid-run, after a checkpoint, from outside, as a
machine is lost."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paraplan_process import run_paraplan, run_script

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import plan_to_dict
from paraplan.system.localnet import free_port

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "GLOO_SOCKET_IFNAME": "lo"}
BASE = dict(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=4, schedule="1f1b",
            grad_sync="none")
FOUR = Plan(**BASE, stages=(Stage(LayerRange(0, 2), (0,)), Stage(LayerRange(2, 3), (1,)),
                            Stage(LayerRange(3, 4), (2,)), Stage(LayerRange(4, 6), (3,))))
THREE = Plan(**BASE, stages=(Stage(LayerRange(0, 2), (0,)), Stage(LayerRange(2, 4), (1,)), Stage(LayerRange(4, 6), (2,))))
TWO = Plan(**BASE, stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
ONE = Plan(**BASE, stages=(Stage(LayerRange(0, 6), (0,)),))
EVERY = 5  # checkpoint interval (steps)


def ladder(path: Path, *plans) -> Path:
    rungs = [{"dropped": [f"device {len(FOUR.devices) - 1 - k}" for k in range(i)], "plan": plan_to_dict(p)}
             for i, p in enumerate(plans)]
    path.write_text(json.dumps({"format": "paraplan.ladder", "version": 1, "model": "gpt2-tiny", "global_batch": 8,
                                "rungs": rungs}))
    return path


def _children(pid: int) -> list[int]:
    """The example's own walk of /proc (examples/lose_a_rank.py: children)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lose_a_rank", ROOT / "examples" / "lose_a_rank.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.children(pid)


def _tree(pid: int) -> list[int]:
    return [pid] + [p for child in _children(pid) for p in _tree(child)]


def _alive(pids) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()
            and (Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split() or ["Z"])[0] != "Z"]


def _wait_for_checkpoint(directory: Path, process, at_least: int = EVERY, timeout_s: float = 180) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            if json.loads((directory / "checkpoint.json").read_text())["step"] >= at_least:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert process.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.03)
    raise AssertionError("no checkpoint within the time limit")


def test_a_lost_rank_carries_on_under_the_next_rung_as_that_plan_would_from_the_checkpoint(tmp_path):
    """One rank of four killed after a checkpoint (examples/lose_a_rank.py, as the guide runs it, on
    its ladder of 4 and then 3 pipeline stages): the launcher stops the other three, starts rung 1 on
    three ranks from the last checkpoint, and the losses from there equal that plan's own run resumed
    from the same checkpoint (fp32 within 1e-5). The switch is in the log and elastic.json with the
    seconds it took; the run's files are the new plan's ranks' only."""
    path = ROOT / "examples" / "gpt2-tiny-ladder-4-3.json"
    from paraplan.plans.ladder_file import ladder_rungs

    assert ladder_rungs(path) == [FOUR, THREE]
    ck, out, kept = tmp_path / "ck", tmp_path / "out", tmp_path / "kept"
    done = run_script(ROOT / "examples" / "lose_a_rank.py", path, "--checkpoint-dir", ck, "--out-dir", out, "--steps",
                      "20", "--checkpoint-every", EVERY, "--keep-checkpoint", kept, env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "killing rank process" in done.stdout
    log = (ck / "elastic.log").read_text()
    lost = re.search(r"rank (\d) lost on rung 0 \(4 devices\): carrying on under rung 1 \(3 devices\) from step (\d+)", log)
    assert lost, log
    step = int(lost.group(2))
    assert step == json.loads((kept / "checkpoint.json").read_text())["step"] == EVERY
    switch = json.loads((out / "elastic.json").read_text())["switches"]
    assert [(s["from_rung"], s["to_rung"], s["from_step"]) for s in switch] == [(0, 1, step)]
    assert switch[0]["seconds"] > 0
    losses = json.loads((out / "losses.json").read_text())
    assert len(losses) == 20
    assert not list(out.glob("steps_rank3.json"))  # the lost rank's files of the first run are gone
    # the reference: rung 1's own run resumed from the checkpoint the elastic run carried on from
    done = run_paraplan("train", "--plan", path, "--rung", "1", "--steps", "20", "--resume", "--checkpoint-dir", kept,
                        "--out-dir", tmp_path / "ref", "--no-dropout", "--json", env=ENV, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = json.loads((tmp_path / "ref" / "losses.json").read_text())
    assert len(reference) == 20
    assert losses == pytest.approx(reference, rel=1e-5)


def test_elastic_needs_a_ladder_and_a_checkpoint_directory(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_to_dict(FOUR)))
    path = ladder(tmp_path / "ladder.json", FOUR, THREE)
    for args, message in ((["--plan", plan, "--checkpoint-dir", tmp_path / "c"], "is a plan; an elastic run needs a "
                                                                                  "fallback ladder"),
                          (["--plan", path], "needs --checkpoint-dir"),
                          (["--plan", path, "--checkpoint-dir", tmp_path / "c", "--resume"], "--resume is decided")):
        done = run_paraplan("train", "--elastic", *args, "--out-dir", tmp_path / "o", env=ENV)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()


def test_under_torchrun_losing_a_node_shrinks_the_world_to_the_next_rung(tmp_path):
    """Two torchrun "nodes" of one worker (`--nnodes 1:2`, a c10d rendezvous on 127.0.0.1, short
    timeouts). The second node, its agent and its worker, is killed after a checkpoint: the first
    node's agent restarts its worker after a new rendezvous of one node, which takes rung 1 (one
    stage) and carries on from the checkpoint to the end; the log says the world shrank; nothing of
    the killed node is left."""
    path = ladder(tmp_path / "ladder.json", TWO, ONE)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    port = free_port()
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--max-restarts", "2", "--rdzv-conf",
            # short timeouts: the dead node's agent is declared gone after 2 missed 1 s keep-alives (the
            # default, 3 of 5 s, was most of the test's time)
            "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2",
            "-m", "paraplan", "train", "--plan", str(path), "--elastic", "--checkpoint-dir", str(tmp_path / "ck"),
            "--checkpoint-every", str(EVERY), "--steps", "40", "--out-dir", str(tmp_path / "out"), "--no-dropout",
            "--timeout", "20"]
    logs = [open(tmp_path / f"node{k}.log", "w") for k in range(2)]
    nodes = [subprocess.Popen([torchrun, *args], env=ENV, stdout=logs[0], stderr=subprocess.STDOUT,
                              start_new_session=True)]
    time.sleep(0.5)  # the first node hosts the rendezvous's store, and must outlive the other
    nodes.append(subprocess.Popen([torchrun, *args], env=ENV, stdout=logs[1], stderr=subprocess.STDOUT,
                                  start_new_session=True))
    victims = []
    try:
        _wait_for_checkpoint(tmp_path / "ck", nodes[0])
        victims = _tree(nodes[1].pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert nodes[0].wait(timeout=240) == 0, (tmp_path / "node0.log").read_text()[-3000:]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
        for log in logs:
            log.close()
    text = (tmp_path / "ck" / "elastic.log").read_text()
    assert "the world went from 2 to 1 device (a node's agent left): rung 0 -> rung 1, from the checkpoint at step" \
        in text, text
    assert len(json.loads((tmp_path / "out" / "losses.json").read_text())) == 40
    time.sleep(0.5)
    assert not _alive(victims)

