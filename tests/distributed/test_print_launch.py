"""`paraplan train --print-launch` (runtime/launcher/launch_script.py): the printed node commands, run as
printed (through bash) as two "nodes" on loopback, train the plan with paraplan's runtime, as one
process does (this is also the suite's check that a pipeline over two torchrun nodes matches one
process). The script's own checks are in tests/unit/test_launch_script.py."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paraplan_process import run_paraplan

from paraplan.system.localnet import free_port

ROOT = Path(__file__).resolve().parents[2]
PLAN_2 = ROOT / "examples" / "gpt2-tiny-local-1f1b-2x4.json"  # 2 stages, one device each
# the venv's torchrun first on PATH (the same Python); gloo on loopback (shared/notes/runtime-on-cpu.md)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "GLOO_SOCKET_IFNAME": "lo",
       "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
TIMEOUT_S = 240


def _in_session(sid: int) -> list[int]:
    """The live processes of a session (a node's torchrun and the ranks it started)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


def _without_exit_barrier_race(stderr: str) -> str:
    """A node's stderr without torchrun's own logged exception when the rendezvous host's agent left
    its exit barrier before another node's agent read the answer (pytorch/pytorch#69520, open; the
    agent logs "Error waiting on exit barrier" with a DistNetworkError and still exits 0, after
    every rank finished: seen once in a fresh-clone make test on 2026-11-26). Any other traceback
    stays."""
    out, skipping = [], False
    for line in stderr.splitlines():
        if "Error waiting on exit barrier" in line:
            skipping = True
        elif skipping and re.match(r"[\w.]+(Error|Exception)\b", line):  # the logged exception's last line
            skipping = False
            continue
        if not skipping:
            out.append(line)
    return "\n".join(out)


def test_the_printed_node_commands_train_the_plan_on_two_nodes(tmp_path):
    out = tmp_path / "two nodes"  # a space: the printed commands quote it
    printed = run_paraplan("train", "--plan", PLAN_2, "--print-launch", "--nodes", "2", "--gpus-per-node", "1",
                           "--master", "127.0.0.1", "--port", free_port(), "--steps", "2", "--out-dir", out,
                           "--no-dropout", "--optimizer", "sgd", "--lr", "0.1", env=ENV, timeout=120)
    assert printed.returncode == 0, printed.stderr
    commands = [line for line in printed.stdout.splitlines() if line.startswith("torchrun ")]
    assert len(commands) == 2 and "--node-rank 0" in commands[0] and "--node-rank 1" in commands[1]
    assert not out.exists()  # printing starts nothing

    # each node in a session of its own: whatever its torchrun started can be found and, on a failure, ended
    nodes = [subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for command in commands]
    deadline = time.monotonic() + TIMEOUT_S
    results = []
    try:
        for node in nodes:
            results.append(node.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for node in nodes:
            if node.poll() is None or _in_session(node.pid):
                os.killpg(node.pid, signal.SIGKILL)
                node.communicate()
    assert [node.returncode for node in nodes] == [0, 0], [(c, err[-3000:]) for c, (_, err) in zip(commands, results, strict=True)]
    assert all("Traceback" not in _without_exit_barrier_race(err) for _, err in results), [err for _, err in results]
    losses = json.loads((out / "losses.json").read_text())
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), losses
    # two torchrun nodes train as one process does (fp32 within 1e-5)
    from paraplan.plans.plan_file import read_plan
    from paraplan.runtime.config import TrainConfig
    from paraplan.runtime.measure.reference import reference_run

    plan = read_plan(PLAN_2)
    reference, _ = reference_run(TrainConfig(plan=plan, model=plan.model, steps=2, dropout=False, optimizer="sgd",
                                             lr=0.1))
    assert losses == pytest.approx(reference, rel=1e-5)
    # node 1's process is rank 1: both stages wrote their step times
    assert sorted(p.name for p in out.glob("steps_rank*.json")) == ["steps_rank0.json", "steps_rank1.json"]
    time.sleep(0.5)
    assert not [pid for node in nodes for pid in _in_session(node.pid)], "a process of a node outlived it"

