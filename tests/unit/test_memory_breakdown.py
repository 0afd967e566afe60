"""What each device holds at the instant of its peak, by category (issue 29, item 4): the parts sum
to the peak the plan reports, for every kind of plan; the states split into parameters, gradients
and optimizer states; `paraplan simulate` prints them heaviest device first."""

import pytest
from conftest import run_cli_here

import paraplan
from paraplan.plans.plan_file import write_plan

CASES = [  # (model, cluster, batch, planner, keywords)
    ("gpt2-tiny", "dgx-a100-80gb", 8, "even", {"stages": 2}),  # bf16 pipeline
    ("gpt2-tiny", "dgx-a100-80gb", 16, "galvatron", {}),  # bf16 per-layer hybrid strategies
    ("gpt2-tiny", "galvatron-8xtitan", 16, "galvatron", {}),  # fp32, CUDA terms
    ("vgg-tiny", "bipartition-7vm", 16, "bipartition", {}),  # forward-only layers on a worker
    ("gpt2-tiny", "local", 8, "csimd", {"stages": 2}),  # CPU: no CUDA context, no allocator
]


@pytest.mark.parametrize("model, cluster, batch, planner, kw", CASES, ids=[f"{c[3]}-{c[1]}" for c in CASES])
def test_the_parts_at_the_peak_sum_to_the_peak(model, cluster, batch, planner, kw):
    sim = paraplan.simulate(paraplan.plan(model, cluster, batch, planner=planner, **kw))
    peaks = {m.device: m.peak_bytes for m in sim.prediction.memory}
    for b in sim.memory:
        moment, parts = b.at_peak()
        assert moment in ("forward/backward", "optimizer step")
        assert sum(nbytes for _, nbytes in parts) == pytest.approx(b.peak_bytes, rel=1e-12)
        assert round(b.peak_bytes) == peaks[b.device]
        assert b.param_state_bytes + b.grad_bytes + b.optimizer_bytes == pytest.approx(b.states_bytes, rel=1e-12)
        assert [n for n, _ in parts] == [n for n, _ in sorted(parts, key=lambda x: -x[1])]


def test_adam_in_fp32_holds_twice_the_parameters_in_optimizer_states():
    sim = paraplan.simulate(paraplan.plan("gpt2-tiny", "galvatron-8xtitan", 8, planner="even", stages=2))
    for b in sim.memory:
        assert b.optimizer_bytes == pytest.approx(2 * b.param_state_bytes) and b.grad_bytes == b.param_state_bytes


def test_simulate_prints_the_heaviest_stage_first(capsys, tmp_path):
    plan = paraplan.plan("gpt2-tiny", "dgx-a100-80gb", 8, planner="even", stages=2)
    write_plan(plan, tmp_path / "plan.json")
    r = run_cli_here(capsys, "simulate", str(tmp_path / "plan.json"))
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("memory at each device's peak")[1]
    rows = [line for line in table.splitlines() if "forward/backward" in line or "optimizer step" in line]
    heavy = max(paraplan.simulate(plan).memory, key=lambda b: b.peak_bytes)
    assert len(rows) == 2 and rows[0].split("│")[1].strip() == str(heavy.stage)
    assert "16-bit weight copies" in table and "optimizer states" in table
