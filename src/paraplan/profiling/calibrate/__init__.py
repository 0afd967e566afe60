"""`paraplan calibrate`: measure this machine once and describe it as a cluster file that `plan`,
`simulate` and `train --compare` use.

Three measurements, each the way training meets it (a training run keeps every core busy):
  1. compute: reference models profiled layer by layer (profiling/profiler.py) on one core while
     every other core runs training steps of the same model ("loaded"), and once with the other
     cores idle; the analytic device model is fitted to the loaded times
     (costs/calibration_fit.py), so a model never profiled is priced at this machine's rate;
  2. links: gloo ping-pong between two processes, fitted to alpha + bytes / beta
     (profiling/links.py), idle and while every core also runs a busy process ("loaded": a
     transfer in a pipeline waits for a core that is computing);
  3. the runtime's own overheads (per pipeline action, per step; runtime/measure/compare.py) read off the
     timelines of several real `paraplan train` runs of one plan and averaged, so one run's noise
     does not become the model.
Everything measured is kept in the file's [calibration] table, beside the figures it chose.

The package: machine.py puts the three together into the calibrated cluster (`calibrate`),
compute.py measures compute and links with the other cores loaded (`CoresLoaded`), runtime_costs.py
runs the real training runs the runtime's overheads are read from.
"""

from paraplan.profiling.calibrate.compute import BATCH_SIZES, CoresLoaded, measure_compute, measure_links
from paraplan.profiling.calibrate.machine import QUICK_MODELS, REFERENCE_MODELS, Calibration, calibrate
from paraplan.profiling.calibrate.runtime_costs import (
    CAP_LATENCY_S,
    OVERHEAD_PLAN,
    measure_optimizer,
    measure_overheads,
    measure_strategy_costs,
    message_and_step_costs,
)

__all__ = ["BATCH_SIZES", "CAP_LATENCY_S", "OVERHEAD_PLAN", "QUICK_MODELS", "REFERENCE_MODELS", "Calibration",
           "CoresLoaded", "calibrate", "measure_compute", "measure_links", "measure_optimizer",
           "measure_overheads", "measure_strategy_costs", "message_and_step_costs"]
