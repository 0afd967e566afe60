"""Faults injected into real runs through TrainConfig.step_hook (pickled into the spawned ranks)."""

import os


def rank1_dies_at_step2(rank: int, step: int) -> None:
    if (rank, step) == (1, 2):
        os._exit(17)  # a rank that dies without a word, as a crashed machine would


def stage_files_meet_a_full_disk_from_step2(rank: int, step: int) -> None:
    """From the second step on, every checkpoint file a rank writes (torch.distributed.checkpoint's
    .distcp files) and every stage file of its output directory meets a full disk after 4 KiB, as a
    disk that fills during the run. The disk is injected where DCP opens its files
    (FileSystem.create_stream) and where every atomic write opens its file (fileio._open_temp)."""
    if step != 1:
        return
    import contextlib
    from pathlib import Path

    from full_disk import FullDisk  # tests/, on the ranks' sys.path as on the launcher's
    from torch.distributed.checkpoint import filesystem

    from paraplan.system import fileio

    real = fileio._open_temp

    def open_temp(tmp: str):
        return FullDisk(real(tmp), 4096) if Path(tmp).name.startswith(".stage") else real(tmp)

    fileio._open_temp = open_temp
    create = filesystem.FileSystem.create_stream

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with create(self, path, mode) as stream:
            yield _Proxy(FullDisk(stream, 4096), stream) if str(path).endswith(".distcp") else stream

    filesystem.FileSystem.create_stream = create_stream


def rank1_meets_a_full_disk_from_step2(rank: int, step: int) -> None:
    """The same disk, on rank 1 alone: DCP fails on every rank, but only rank 1 saw the ENOSPC."""
    if rank == 1:
        stage_files_meet_a_full_disk_from_step2(rank, step)


class _Proxy:
    """A FullDisk that also answers what DCP asks of its stream (tell, fileno, ...)."""

    def __init__(self, full, stream):
        self.full, self.stream = full, stream

    def write(self, data):
        return self.full.write(data)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def one_gradient_sync_dropped(rank: int, step: int) -> None:
    """Before the second step, the replicas' next gradient all-reduce is skipped on every rank (once):
    the negative control of the mixed-precision comparison (tests/distributed/test_mixed_precision.py)."""
    if step != 1:
        return
    from paraplan.runtime.pipeline.pipeline_rank import GradSync

    real = GradSync.finish

    def skipped(self):
        GradSync.finish = real  # the next step synchronises again

    GradSync.finish = skipped
