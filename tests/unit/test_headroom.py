"""Issue 49 item 5: plans are not made to the last byte. `paraplan plan` leaves DEFAULT_HEADROOM of
each device's memory unplanned (none of a budget the user gave), `--headroom` changes it."""

from __future__ import annotations

import pytest

from paraplan.errors import FieldError
from paraplan.planners.request import DEFAULT_HEADROOM
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import workload

GIB = 2**30


def _budgets(w) -> set[int]:
    return {slot.spec.memory_bytes for slot in w.request.costs.cluster.devices}


def test_the_default_headroom_applies_to_the_devices_memory_not_to_a_budget_given():
    capacity = 80 * GIB  # dgx-h100-80gb
    assert _budgets(workload("gpt2-tiny", "dgx-h100-80gb", batch=16)) == {int(capacity * (1 - DEFAULT_HEADROOM))}
    assert _budgets(workload("gpt2-tiny", "dgx-h100-80gb", batch=16, memory="16GiB")) == {16 * GIB}
    assert _budgets(workload("gpt2-tiny", "dgx-h100-80gb", batch=16, memory="16GiB", headroom=0.25)) == {12 * GIB}
    assert _budgets(workload("gpt2-tiny", "dgx-h100-80gb", batch=16, headroom=0.0)) == {capacity}
    for bad in (1.0, -0.1, True):
        with pytest.raises(FieldError, match="headroom"):
            workload("gpt2-tiny", "dgx-h100-80gb", batch=16, headroom=bad)


def test_a_plan_made_with_headroom_leaves_it_free_on_the_real_device():
    """The Megatron grid on Llama 3.1 8B over 16 H100: with the default headroom its plan peaks
    within 95% of 80 GiB, judged again on the whole device; planned to the last byte it goes past."""
    from paraplan.planners.registry import make_plan

    peaks = {}
    for headroom in (None, 0.0):
        w = workload("llama3.1-8b", "dgx-h100-80gb", batch=256, precision="bf16", engine="megatron", headroom=headroom)
        whole = workload("llama3.1-8b", "dgx-h100-80gb", precision="bf16", engine="megatron").costs
        plan = make_plan(w.request, "megatron-grid")
        p = simulate_plan(plan, whole).prediction
        assert p.feasible
        peaks[headroom] = max(m.peak_bytes for m in p.memory)
    assert peaks[None] <= (1 - DEFAULT_HEADROOM) * 80 * GIB < peaks[0.0]


def test_the_headroom_flag_takes_a_share_and_refuses_nonsense_in_one_line(capsys, tmp_path):
    import json

    from conftest import run_cli_here

    out = tmp_path / "p.json"
    done = run_cli_here(capsys, "plan", "--model", "gpt2-tiny", "--cluster", "galvatron-8xtitan", "--batch", "16",
                        "--planner", "auto", "--time-limit", "20", "--headroom", "10%", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["headroom"] == pytest.approx(0.1)
    for bad in ("1.5", "100%", "lots"):
        done = run_cli_here(capsys, "plan", "--model", "gpt2-tiny", "--cluster", "galvatron-8xtitan", "--batch", "16",
                            "--headroom", bad, "--out", str(tmp_path / "q.json"))
        assert done.returncode == 2 and "--headroom" in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "q.json").exists()


def test_a_replaced_request_keeps_its_limits_applied_once():
    """dataclasses.replace runs PlanRequest.__post_init__ again: the headroom (and a budget) must
    not be taken off twice (a comparison's Galvatron searches had planned within 90.25%, and the
    batch searches less at every batch tried), and the cost model stays the same object, which the
    searches' caches are keyed by."""
    from dataclasses import replace

    from paraplan.workload import workload

    request = workload("gpt2-tiny", "dgx-h100-80gb?nodes=1", batch=16).request
    capacity = request.costs.cluster.devices[0].spec.memory_bytes
    assert request.headroom == 0.05 and capacity == int(80 * 2**30 * 0.95)
    again = replace(replace(request, options={"portfolio": False}), batch=8)
    assert again.costs is request.costs
    assert replace(request, headroom=0.1).costs.cluster.devices[0].spec.memory_bytes == int(80 * 2**30 * 0.9)
    budget = replace(request, memory_bytes=2**34, headroom=0.0)
    assert budget.costs.cluster.devices[0].spec.memory_bytes == 2**34
    assert replace(budget, batch=4).costs.cluster.devices[0].spec.memory_bytes == 2**34
