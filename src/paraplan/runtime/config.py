"""A training run's `TrainConfig`: the run's settings (rank/rank_base.py: RunConfig, each field
checked) whose plan its kind's runtime runs (runtime/kinds.py: `RUNNERS[plan.kind].refuse`), so
that what the runtime does not run is refused in one line when the run is described, before
anything is built. The command line, the Python API, calibrate and `--prove` make their runs'
configs here; the kinds' modules read them as RunConfigs.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.runtime.kinds import RUNNERS
from paraplan.runtime.rank.rank_base import RunConfig


@dataclass(frozen=True, kw_only=True)
class TrainConfig(RunConfig):
    """Everything one training run needs, validated once here (errors name the field)."""

    def __post_init__(self):
        RUNNERS[self.plan.kind].refuse(self)  # the plan first: what its kind does not run
        super().__post_init__()
