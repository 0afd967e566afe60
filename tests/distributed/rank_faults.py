"""Faults injected into real runs through TrainConfig.step_hook (pickled into the spawned ranks)."""


def rank1_raises_a_long_error_at_step1(rank: int, step: int) -> None:
    """A multi-line message whose last line says nothing (as torch's pipelining wraps errors)."""
    if (rank, step) == (1, 1):
        raise ValueError("\n   the batch was empty:\n      shape (0, 16)\n   kwargs: {}\n")
