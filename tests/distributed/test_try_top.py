"""`paraplan plan --try-top K` on real processes (issue 31, item 6): two plans of gpt2-tiny on one
process whose measured steps differ by about 3x — the whole batch in one micro-batch (40 ms on a quiet
machine), and the same batch as 32 micro-batches of one sample (118 ms: every micro-batch pays the
per-operator overhead again) — with the predictions deliberately reversed: the measured best is
chosen, not the predicted one. Both plans are one process so that a loaded machine slows both alike;
a two-process pipeline as the slow plan measured only 1.5x on CI beside the other test worker."""

from dataclasses import replace

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.runtime.launcher.prove import measured_best


def test_the_measured_best_is_chosen_over_a_wrong_prediction():
    one = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=32, n_micro=1, schedule="gpipe",
               grad_sync="none", stages=(Stage(LayerRange(0, 6), (0,)),))
    many = replace(one, n_micro=32)
    # the predictions say the slow plan is 5x faster
    chosen, measured = measured_best({"32 micro-batches": (many, 0.01), "one micro-batch": (one, 0.05)},
                                     rounds=1, steps=4)
    by_name = {m.name: m for m in measured}
    # measured 2.9-3.0x apart at load 0.9 (2026-11-28, interleaved): the gap a wrong prediction must
    # lose to; 1.5x leaves room for the 10-25% drift between runs on this machine
    assert by_name["32 micro-batches"].median_s > 1.5 * by_name["one micro-batch"].median_s
    assert chosen == "one micro-batch"
