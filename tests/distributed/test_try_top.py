"""`paraplan plan --try-top K` on real processes (issue 31, item 6): two plans of gpt2-tiny on this
machine whose measured steps differ by more than 2x — the whole batch in one micro-batch on one
process (~80 ms), and 32 micro-batches of one sample through a 2-stage pipeline on two processes
(~370 ms at load 2.4: every micro-batch crosses gloo twice; the one-process version of the slow plan
measured only 2.65x at the load of `make test`) — with the predictions deliberately reversed: the
measured best is chosen, not the predicted one."""

from dataclasses import replace

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.runtime.launcher.prove import measured_best


def test_the_measured_best_is_chosen_over_a_wrong_prediction():
    one = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=32, n_micro=1, schedule="gpipe",
               grad_sync="none", stages=(Stage(LayerRange(0, 6), (0,)),))
    many = replace(one, n_micro=32, stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
    # the predictions say the slow plan is 5x faster
    chosen, measured = measured_best({"32 micro-batches, 2 stages": (many, 0.01), "one micro-batch": (one, 0.05)},
                                     rounds=1, steps=4)
    by_name = {m.name: m for m in measured}
    # measured 2.4x-3.6x apart at load 1.4-2.0 (2026-11-27, before and after issue 47's runtime move,
    # interleaved): the gap a wrong prediction must lose to, well clear of timing noise
    assert by_name["32 micro-batches, 2 stages"].median_s > 2 * by_name["one micro-batch"].median_s
    assert chosen == "one micro-batch"
