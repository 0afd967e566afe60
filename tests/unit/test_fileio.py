"""Writes never replace what is not a regular file, leave nothing half-written, and a full disk is
one line (issue 27, point 1). Every special file is made under the test's own tmp_path (a FIFO, a
symbolic link, a null device node where this user may make one); a full disk is injected, never
real."""

import errno
import os
import stat
from pathlib import Path

import pytest
from conftest import run_cli_here
from full_disk import FullDisk

from paraplan.system import fileio
from paraplan.system.fileio import (
    WriteError,
    atomic_torch_save,
    atomic_write,
    atomic_write_text,
    output_problem,
    remove_temporaries,
)

ROOT = Path(__file__).resolve().parents[2]
LOCAL_PLAN = ROOT / "examples" / "gpt2-tiny-local-1f1b-2x4.json"


def _fifo(tmp_path):
    path = tmp_path / "out.json"
    os.mkfifo(path)
    return path, "a FIFO"


def _link(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("keep me")
    path = tmp_path / "out.json"
    path.symlink_to(target)
    return path, "a symbolic link"


def _dangling(tmp_path):
    path = tmp_path / "out.json"
    path.symlink_to(tmp_path / "nowhere.json")
    return path, "a symbolic link"


def _null_device(tmp_path):
    """/dev/null's twin, here (root may make device nodes; anyone else is skipped). Writing to it
    would be harmless, and nothing here writes to it."""
    path = tmp_path / "out.json"
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path, "a character device"


SPECIAL = [_fifo, _link, _dangling, _null_device]


def _snapshot(directory: Path) -> dict[str, tuple[int, str]]:
    """Each entry's type bits and, for regular files, content: what a refused write must not change."""
    out = {}
    for entry in directory.iterdir():
        mode = entry.lstat().st_mode
        out[entry.name] = (stat.S_IFMT(mode), entry.read_text() if stat.S_ISREG(mode) else "")
    return out


@pytest.mark.parametrize("make", SPECIAL, ids=lambda f: f.__name__.strip("_"))
def test_writes_refuse_a_target_that_is_not_a_regular_file(tmp_path, make):
    # was: output_problem said nothing and atomic_write renamed a regular file over the node (as
    # root, `paraplan plan --out /dev/full` exited 0 and turned /dev/full into a file)
    path, kind = make(tmp_path)
    before = _snapshot(tmp_path)
    line = f"{path} is not a regular file ({kind}): refusing to replace it"
    assert output_problem(path) == line
    for write in (lambda: atomic_write_text(path, "x"), lambda: atomic_torch_save({"x": 1}, path),
                  lambda: atomic_write(path, lambda tmp: Path(tmp).write_text("x"))):
        with pytest.raises(WriteError) as info:
            write()
        assert str(info.value) == line
    assert _snapshot(tmp_path) == before  # the node, the link and its target untouched; no temporary


@pytest.mark.parametrize("make", [_fifo, _link], ids=["fifo", "link"])
def test_the_cli_refuses_it_before_any_work(tmp_path, capsys, make):
    path, kind = make(tmp_path)
    # the model does not exist either: the output is refused first, before anything is looked up
    res = run_cli_here(capsys, "plan", "--model", "no-such-model", "--cluster", "local", "--batch", "8",
                       "--planner", "csimd", "--out", str(path))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"paraplan: error: --out: {path} is not a regular file ({kind}): refusing to replace it"]
    assert stat.S_IFMT(path.lstat().st_mode) == (stat.S_IFIFO if kind == "a FIFO" else stat.S_IFLNK)


def test_train_refuses_special_files_in_its_directories_before_launch(tmp_path, capsys):
    # the run's own files inside --out-dir / --checkpoint-dir: refused before the model is measured
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "losses.json")
    res = run_cli_here(capsys, "train", "--plan", str(LOCAL_PLAN), "--out-dir", str(run))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"paraplan: error: --out-dir: {run / 'losses.json'} is not a regular file (a FIFO): refusing to replace it"]
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "checkpoint.json").symlink_to(tmp_path / "elsewhere")
    res = run_cli_here(capsys, "train", "--plan", str(LOCAL_PLAN), "--out-dir", str(tmp_path / "b"),
                       "--checkpoint-dir", str(ck))
    assert res.returncode == 2 and "--checkpoint-dir:" in res.stderr and "(a symbolic link)" in res.stderr
    assert not (tmp_path / "b").exists()


def test_a_target_that_appears_during_the_write_is_not_replaced(tmp_path):
    path = tmp_path / "out.json"

    def write(tmp):
        Path(tmp).write_text("new")
        os.mkfifo(path)  # made by someone else while we wrote

    with pytest.raises(WriteError, match="a FIFO"):
        atomic_write(path, write)
    assert stat.S_ISFIFO(path.lstat().st_mode) and [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_a_full_disk_is_one_line_and_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, code):
    # was: torch.save straight to the name gave "[enforce fail at inline_container.cc:672] ...
    # unexpected pos" and left a truncated file; a text write, an OSError traceback
    import torch

    monkeypatch.setattr(fileio, "_open_temp", lambda tmp: FullDisk(open(tmp, "wb"), 4096, code))
    text, weights = tmp_path / "losses.json", tmp_path / "stage0.pt"
    text.write_text("old")
    weights.write_text("old")
    for path, write in ((text, lambda: atomic_write_text(text, "x" * 10_000)),
                        (weights, lambda: atomic_torch_save({"w": torch.zeros(10_000)}, weights))):
        with pytest.raises(WriteError) as info:
            write()
        assert str(info.value) == f"no space left on device: {path}"
    assert _snapshot(tmp_path) == {"losses.json": (stat.S_IFREG, "old"), "stage0.pt": (stat.S_IFREG, "old")}


def test_a_full_disk_met_when_flushing_to_the_disk_is_one_line_too(tmp_path, monkeypatch):
    # delayed allocation: write() succeeds into the page cache and the disk is found full at fsync,
    # which must happen before the rename replaces the old file
    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    path = tmp_path / "plan.json"
    path.write_text("old")
    with pytest.raises(WriteError, match=f"^no space left on device: {path}$"):
        atomic_write(path, lambda tmp: Path(tmp).write_text("new"))
    assert _snapshot(tmp_path) == {"plan.json": (stat.S_IFREG, "old")}


def test_a_full_disk_through_the_cli_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fileio, "_open_temp", lambda tmp: FullDisk(open(tmp, "wb"), 10))
    out = tmp_path / "p.json"
    res = run_cli_here(capsys, "plan", "--planner", "csimd", "--model", "lenet-5", "--cluster", "local", "--batch",
                       "8", "--stages", "1", "--micro-batches", "1", "--out", str(out))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"paraplan: error: no space left on device: {out}"]
    assert list(tmp_path.iterdir()) == []


def test_stream_writes_return_the_sha256_of_what_they_wrote(tmp_path):
    import hashlib

    import torch

    digest, size = atomic_torch_save({"w": torch.arange(1000)}, tmp_path / "w.pt")
    data = (tmp_path / "w.pt").read_bytes()
    assert (digest, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert torch.equal(torch.load(tmp_path / "w.pt")["w"], torch.arange(1000))


def test_remove_temporaries_removes_only_temporaries(tmp_path):
    (tmp_path / f".stage0.pt{fileio.TEMP_MARK}abc.pt").write_text("half")
    (tmp_path / "stage0.pt").write_text("whole")
    (tmp_path / ".hidden").write_text("mine")
    remove_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "stage0.pt"]
