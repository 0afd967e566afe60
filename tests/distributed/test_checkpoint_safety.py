"""Checkpoints that survive a full disk, and resumes refused before launch when the checkpoint does
not fit the run (issue 27, points 1 and 2). One real run (two gloo ranks) makes a checkpoint at
step 1 and meets a full disk at step 2; every resume check then runs in this process on what it
left."""

import contextlib
import io
import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import run_cli_here

from paraplan.errors import FieldError
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import write_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.state.checkpoints import MANIFEST, check_resume, remove_unlisted
from paraplan.system.fileio import TEMP_MARK

from .faults import rank1_meets_a_full_disk_from_step2, stage_files_meet_a_full_disk_from_step2

PLAN = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=2, schedule="1f1b",
            grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))


def _train_meeting(hook, root) -> tuple[int, str]:
    """`paraplan train --steps 2 --checkpoint-every 1` of PLAN in `root`, in this process, its ranks
    given `hook` (a step hook passed through the launcher): (exit status, stderr)."""
    from paraplan.cli import main
    from paraplan.runtime.launcher import launch

    write_plan(PLAN, root / "plan.json")
    spawn = launch.spawn
    stderr = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(stderr), \
            contextlib.redirect_stdout(io.StringIO()):
        mp.setattr(launch, "spawn", lambda config, world: spawn(replace(config, step_hook=hook), world))
        code = main(["train", "--plan", str(root / "plan.json"), "--steps", "2", "--checkpoint-every", "1",
                     "--checkpoint-dir", str(root / "ck"), "--out-dir", str(root / "run"), "--timeout", "30"])
    return code, stderr.getvalue()


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """The run with a disk that fills at step 2 on every rank."""
    root = tmp_path_factory.mktemp("full-disk")
    code, stderr = _train_meeting(stage_files_meet_a_full_disk_from_step2, root)
    return SimpleNamespace(root=root, ck=root / "ck", out=root / "run", code=code, stderr=stderr)


def _config(failed, **changes) -> TrainConfig:
    """The failed run's own configuration (the CLI's defaults), resumed, with `changes`."""
    return TrainConfig(**{"plan": PLAN, "model": "gpt2-tiny", "steps": 2, "checkpoint_dir": str(failed.ck),
                          "resume": True, **changes})


def test_a_full_disk_in_a_rank_is_one_line_and_keeps_the_last_checkpoint(failed):
    # was: "[enforce fail at inline_container.cc:672] ... unexpected pos" from torch.save straight
    # to the final name, a 0-byte or truncated stage file left, and 0-byte stage*.tmp in the
    # checkpoint directory; with DCP (issue 32), its CheckpointException of every rank's failures
    lines = failed.stderr.strip().splitlines()
    assert failed.code == 2 and len(lines) == 1, failed.stderr
    assert f"no space left on device: {failed.ck}/step2" in lines[0] and "Traceback" not in failed.stderr
    left = [p for d in (failed.ck, failed.out) for p in d.rglob("*") if p.is_file()]
    assert not [p.name for p in left if TEMP_MARK in p.name or p.suffix == ".tmp" or p.stat().st_size == 0]
    # the half-written step-2 state is gone (the launcher removes what no manifest names)
    assert sorted(p.name for p in failed.ck.iterdir()) == [MANIFEST, "step1"]
    assert check_resume(_config(failed)) == 1  # the step-1 checkpoint is whole: sha256 and record match


def test_a_full_disk_on_one_rank_is_one_line_too(tmp_path):
    """DCP's CheckpointException reaches every rank; the rank that met the disk knows why: every rank
    asks, so the line is the disk's whichever rank the launcher reports (it was a 63-line traceback)."""
    code, stderr = _train_meeting(rank1_meets_a_full_disk_from_step2, tmp_path)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"no space left on device: {tmp_path / 'ck'}/step2" in lines[0], lines
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [MANIFEST, "step1"]


OTHER_DATA = "other-data"  # stands for a token file made under the test's tmp_path


@pytest.mark.parametrize("changes,field,needle", [
    ({"plan": replace(PLAN, global_batch=16)}, "resume",
     "the checkpoint was written with global batch 8; this plan's is 16"),
    ({"optimizer": "sgd"}, "optimizer", "the checkpoint was written with the adam optimizer, not sgd"),
    ({"lr": 0.01}, "lr", "the checkpoint was written with adam lr 0.001 (this run: 0.01)"),
    ({"clip_norm": 1.0}, "clip_norm", "clip norm None (this run: 1.0)"),
    ({"seed": 1}, "resume", "synthetic data, seed 0; this run's come from synthetic data, seed 1"),
    ({"data": OTHER_DATA}, "resume", "resuming must continue from the same data position"),
    ({"steps": 1}, "steps", "must be more than 1 to train further: the checkpoint is at step 1"),
    ({"model": "gpt2-tiny", "seq_len": 16}, "resume", "belongs to another model: 'gpt2-tiny'; this run trains "
                                                       "'gpt2-tiny', seq len 16"),
])
def test_a_resume_that_does_not_fit_the_checkpoint_is_one_line(failed, tmp_path, changes, field, needle):
    # was: accepted (another batch, plan, data, hyper-parameters), a KeyError after the ranks
    # started (another optimizer), or a traceback once they ended (--steps not past the checkpoint)
    if changes.get("data") == OTHER_DATA:
        (tmp_path / "train.bin").write_bytes(bytes(4096))
        changes = {**changes, "data": str(tmp_path / "train.bin")}
    with pytest.raises(FieldError) as info:
        check_resume(_config(failed, **changes))
    assert info.value.field == field and needle in info.value.detail and "\n" not in str(info.value)


@pytest.mark.parametrize("damage,needle", [
    ("flip", "__1_0.distcp is damaged: its sha256 does not match checkpoint.json's"),
    ("truncate", "__1_0.distcp is damaged: 4096 bytes, checkpoint.json says"),
])
def test_a_damaged_checkpoint_is_named_before_launch(failed, tmp_path, damage, needle):
    # was: 4 KiB flipped in the middle passed the check and failed 15 s later in miniz
    ck = tmp_path / "ck"
    shutil.copytree(failed.ck, ck)
    path = ck / "step1" / "__1_0.distcp"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        middle = len(data) // 2
        data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])
    else:
        data = data[:4096]
    path.write_bytes(bytes(data))
    with pytest.raises(FieldError, match=needle):
        check_resume(_config(failed, checkpoint_dir=str(ck)))


def test_another_plan_is_accepted_and_said(failed):
    """Issue 32: the state is keyed by the model's names, so another cut, micro-batch count or
    strategy resumes (tests/distributed/test_replan_resume.py runs them); the CLI says so."""
    from paraplan.runtime.state.checkpoints import resume_note

    other = replace(PLAN, n_micro=4, stages=(Stage(LayerRange(0, 2), (0,)), Stage(LayerRange(2, 6), (1,))))
    config = _config(failed, plan=other)
    assert check_resume(config) == 1
    assert resume_note(config, 1) == (
        "resuming step 1 under another plan: written under 2 stages (layers 0-3 on [0]; layers 3-6 on [1]), "
        "2 micro-batches, 1f1b, fp32; now 2 stages (layers 0-2 on [0]; layers 2-6 on [1]), 4 micro-batches, 1f1b, "
        "fp32 (the state re-sharded by torch.distributed.checkpoint)")
    assert resume_note(_config(failed), 1) is None


def test_the_cli_refuses_them_before_launch(failed, capsys):
    for extra, needle in ((("--optimizer", "sgd", "--steps", "3"), "--optimizer: the checkpoint was written with "
                                                                   "the adam optimizer"),
                          (("--steps", "1"), "--steps: must be more than 1 to train further")):
        res = run_cli_here(capsys, "train", "--plan", str(failed.root / "plan.json"), "--checkpoint-dir",
                           str(failed.ck), "--resume", "--out-dir", str(failed.root / "again"), *extra)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"paraplan: error: {needle}"), res.stderr
    assert not (failed.root / "again").exists()


def test_a_save_that_never_completed_is_removed_and_the_manifest_kept(failed, tmp_path):
    # what a run that failed between DCP's files and its manifest leaves: the launcher removes the
    # directories no manifest names and the temporaries (the listed checkpoint stays)
    ck = tmp_path / "ck"
    shutil.copytree(failed.ck, ck)
    (ck / "step2").mkdir()
    (ck / "step2" / "__0_0.distcp").write_bytes(b"half")
    (ck / f".checkpoint.json{TEMP_MARK}x").write_bytes(b"half")
    (ck / "steps_notes").mkdir()  # a user's own folders are never touched (they were, by the glob step*)
    (ck / "steps_notes" / "README").write_text("important")
    (ck / "stepwise").mkdir()
    remove_unlisted(ck)
    assert sorted(p.name for p in ck.iterdir()) == [MANIFEST, "step1", "steps_notes", "stepwise"]
    assert json.loads((ck / MANIFEST).read_text())["step"] == 1
