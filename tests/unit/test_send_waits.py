"""Who waits for a pipeline message, as torch 2.13's schedules do on gloo (simulator/pipeline.py):
ScheduleGPipe posts its sends and waits for them only after its last forward (and backward), so a
GPipe sender goes on computing; Schedule1F1B batches a send with its next receive and waits for
both, so a 1F1B sender pays the message, and the calibrated exchange cost beyond the link
(RuntimeOverheads.exchange_s) is 1F1B's alone. make demo's 8-micro-batch GPipe split was predicted
68 ms with every send on its sender's path and a 1F1B-fitted 880 us a message; it ran in 47-49."""

import pytest

from paraplan.simulator.pipeline import PipelineWork, StageWork, run


def _work(schedule: str, exchange_s: float = 0.0) -> PipelineWork:
    fast = StageWork(device=0, forward_s=0.1, backward_s=0.2, send_forward_s=0.5, send_backward_s=0.0)
    slow = StageWork(device=1, forward_s=1.0, backward_s=2.0, send_forward_s=0.0, send_backward_s=0.5)
    return PipelineWork(schedule=schedule, n_micro=3, replicas=((fast, slow),), n_devices=2, rendezvous=True,
                        exchange_s=exchange_s)


def test_a_gpipe_sender_does_not_wait_for_its_send():
    """By hand: the slow stage's forwards end at 4.6 (each waits for the previous one and a 0.5 s
    transfer); its backwards run back to back, 4.6 .. 10.6, each gradient leaving as it ends; the
    fast stage's last backward takes the last gradient at 11.1 and ends at 11.3. A sender that
    waited would start each backward 0.5 s later: 12.3."""
    assert run(_work("gpipe")).iteration_s == pytest.approx(11.3)


def test_the_exchange_cost_is_1f1bs_alone():
    assert run(_work("gpipe", exchange_s=0.2)).iteration_s == pytest.approx(run(_work("gpipe")).iteration_s)
    plain, exchanged = run(_work("1f1b")).iteration_s, run(_work("1f1b", exchange_s=0.2)).iteration_s
    # 1F1B's sends wait: every exchange lies on the slow stage's path, 3 gradients sent after its backwards
    assert exchanged >= plain + 3 * 0.2 - 1e-9
