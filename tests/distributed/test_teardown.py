"""How ranks end, on real gloo processes: a rank's exception reaches the launcher as its type and
message on one line; a tensor-parallel (DTensor) and an FSDP2 rank hold no DTensor and no DeviceMesh
when the process group is destroyed (runtime/launcher/teardown.py: live ones keep gloo groups for the
interpreter's shutdown, where gloo can abort the process). One launch per test, 2 steps."""

import json

import pytest

from paraplan.errors import ParaplanError
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import read_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.launcher.launch import spawn
from paraplan.runtime.launcher.teardown import RECORD_ENV

from .rank_faults import rank1_raises_a_long_error_at_step1

GPT2_2 = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=2, schedule="1f1b",
              grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))


def test_a_rank_that_raises_is_reported_by_its_type_and_message(tmp_path):
    """The message's first line and the line it introduces, not its last line (`kwargs: {}`)."""
    config = TrainConfig(plan=GPT2_2, model="gpt2-tiny", steps=3, timeout_s=20, out_dir=str(tmp_path),
                         step_hook=rank1_raises_a_long_error_at_step1)
    with pytest.raises(ParaplanError) as caught:
        spawn(config, 2)
    assert str(caught.value) == "training stopped: rank 1 failed: ValueError: the batch was empty: shape (0, 16)"


@pytest.mark.parametrize("planner", ["tp", "sdp"])
def test_no_dtensor_or_mesh_is_alive_when_the_process_group_is_destroyed(tmp_path, monkeypatch, planner):
    """A plan straight from `paraplan plan` (TP2 or SDP2 on every layer of gpt2-tiny); each rank
    counts DTensors and DeviceMeshes among the collector's objects just before destroying the group."""
    from paraplan.cli import main

    plan_path = tmp_path / "plan.json"
    assert main(["plan", "--planner", planner, "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8",
                 "--out", str(plan_path)]) == 0
    plan = read_plan(plan_path)
    assert {st.tp if planner == "tp" else st.sdp for st in plan.stages[0].strategies} == {2}
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv(RECORD_ENV, str(record))  # the spawned ranks inherit the environment
    spawn(TrainConfig(plan=plan, model=plan.model, steps=2, out_dir=str(tmp_path)), 2)
    counts = [json.loads((record / f"teardown_rank{r}.json").read_text()) for r in range(2)]
    for c in counts:
        assert c["at_destroy"] == {"dtensors": 0, "meshes": 0}, c
        # the count sees meshes where there are some: torch's caches held them until emptied
        assert c["before_caches_cleared"]["meshes"] > 0, c
