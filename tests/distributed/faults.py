"""Faults injected into real runs through TrainConfig.step_hook (pickled into the spawned ranks)."""

import os


def rank1_dies_at_step2(rank: int, step: int) -> None:
    if (rank, step) == (1, 2):
        os._exit(17)  # a rank that dies without a word, as a crashed machine would
