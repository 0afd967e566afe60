"""Issue 46, "what the screen shows": the Gantt chart of a large plan, the comparison's memory
column on a mixed cluster, one-process plans' shape, `paraplan clusters`' peaks, the report's
status line and time, errors of a prediction stated one way, and one count, one unit per column
and no negative zero in a comparison's table and report."""

import contextlib
import io
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import matplotlib.image
import pytest
from conftest import run_cli_here

from paraplan.planners import auto
from paraplan.planners.auto import describe
from paraplan.plans.plan import LayerRange, OperatorPlacement, Plan, Stage

MIXED = """format_version = 1
name = "mixed-test"

[device_types.small]
peak_flops = 14e12
memory_bandwidth_bytes_per_s = 900e9
memory_gib = 1
kernel_overhead_s = 1e-5
max_efficiency = 0.6
half_efficiency_flops = 1e8

[device_types.big]
peak_flops = 19.5e12
memory_bandwidth_bytes_per_s = 1555e9
memory_gib = 64
kernel_overhead_s = 8e-6
max_efficiency = 0.7
half_efficiency_flops = 8e7

[[nodes]]
name = "server"
devices = ["small", "big"]
intra_link = { bandwidth_bytes_per_s = 10e9, latency_s = 1e-5 }
network = { bandwidth_bytes_per_s = 10e9, latency_s = 1e-5 }
"""


# ----- 1. the Gantt chart of 64 devices -----------------------------------------------------------

@pytest.fixture(scope="module")
def big():
    """gpt2-tiny on 64 A100s: the workload, and two plans simulated (data parallel over every
    device as one Galvatron stage, GroPipe's 4 stages x 16 replicas)."""
    from paraplan.planners.registry import make_plan
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    w = workload("gpt2-tiny", "galvatron-64xa100", batch=64)
    sims = {name: simulate_plan(make_plan(w.request, name, predict=False), w.request.costs) for name in ("dp", "gropipe")}
    return SimpleNamespace(workload=w, sims=sims)


def test_a_64_device_plan_that_computes_as_one_group_is_one_row_not_63_empty_ones(big):
    from paraplan.simulator.export import gantt_rows

    sim = big.sims["dp"]
    assert len(sim.plan.stages[0].devices) == 64
    layout = gantt_rows(sim.timeline, plan=sim.plan)
    assert [r.label for r in layout.rows] == ["devices 0-63 (stage 0)"]
    assert all(any(t[1] == "compute" for t in r.tasks) for r in layout.rows)  # no empty row
    assert "compute together" in layout.caption and "64 devices" in layout.caption


def test_replicas_with_the_same_timeline_collapse_into_one_row_per_stage_and_the_caption_says_so(big):
    from paraplan.simulator.export import gantt_rows

    sim = big.sims["gropipe"]
    layout = gantt_rows(sim.timeline, plan=sim.plan)
    assert len(layout.rows) == sim.plan.n_stages  # one row per pipeline stage
    for s, row in enumerate(layout.rows):
        assert set(row.devices) == set(sim.plan.stages[s].devices) and f"(stage {s}" in row.label
    assert sum("busiest" in r.label for r in layout.rows) == 1
    assert "60 devices with the same timeline as a row shown are not drawn" in layout.caption


def test_past_the_row_limit_the_first_rows_and_the_busiest_are_drawn_and_the_rest_is_named(big):
    from paraplan.simulator.export import gantt_rows

    sim = big.sims["gropipe"]
    layout = gantt_rows(sim.timeline, plan=sim.plan, max_rows=2)
    busiest = max(gantt_rows(sim.timeline, plan=sim.plan).rows, key=lambda r: r.busy_s)
    assert len(layout.rows) == 2 and busiest.devices in [r.devices for r in layout.rows]
    assert "more rows of timelines of their own" in layout.caption and "not drawn" in layout.caption


def test_the_time_axis_reaches_the_iteration_and_shades_the_step_after_the_schedule(big):
    import matplotlib.pyplot as plt

    from paraplan.simulator.export import gantt_figure

    sim = big.sims["dp"]
    iteration = sim.timeline.makespan * 1.4  # e.g. an optimizer step or ZeRO's gather after the schedule
    fig, caption = gantt_figure(sim.timeline, plan=sim.plan, iteration_s=iteration)
    try:
        ax = fig.axes[0]
        assert ax.get_xlim()[1] == pytest.approx(iteration)
        assert "after the schedule" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
        assert [t.get_text() for t in ax.get_yticklabels()] == ["devices 0-63 (stage 0)"]
        assert caption in ax.get_title().replace("\n", " ")
    finally:
        plt.close(fig)


def test_the_report_of_a_64_device_comparison_draws_rows_per_role_and_says_what_it_left_out(big, tmp_path):
    from paraplan.report.html import write_report

    result = auto.compare(big.workload.request, planners=["dp", "gropipe"], time_limit_s=60)
    text = write_report(result, big.workload.request.costs, tmp_path).read_text()
    assert "not drawn" in text or "compute together" in text
    import base64

    gantts = re.findall(r'src="data:image/png;base64,([^"]+)" alt="timeline of', text)
    assert len(gantts) == 2
    for data in gantts:  # 64 rows of 0.6 inch were 5,000 pixels tall
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.shape[0] < 1200


# ----- 2, 3, 5, 7: one comparison on a mixed cluster through the command line ---------------------

@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """`paraplan plan --report` of gpt2-tiny on one 1 GiB device beside a 64 GiB one."""
    from paraplan.cli import main

    tmp = tmp_path_factory.mktemp("mixed")
    (tmp / "mixed.toml").write_text(MIXED)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--model", "gpt2-tiny", "--cluster", str(tmp / "mixed.toml"), "--batch", "8", "--headroom", "0",
                     "--out", str(tmp / "plan.json"), "--report", str(tmp / "report")])
    return SimpleNamespace(code=code, stdout=out.getvalue(), stderr=err.getvalue(), dir=tmp,
                           html=(tmp / "report" / "index.html").read_text())


def test_the_memory_column_is_the_tightest_devices_own_peak_over_its_own_capacity(mixed_run):
    assert mixed_run.code == 0, mixed_run.stderr
    # every plan binds on the 1 GiB device: the 64 GiB one's capacity is never the denominator
    cells = re.findall(r"([\d.]+ \w?i?B) / ([\d.]+ \w?i?B) \(dev (\d+), (\w+)\)", mixed_run.stdout)
    assert cells and all(cap == "1.00 GiB" and dev == "0" and kind == "small" for _, cap, dev, kind in cells)
    assert "/ 64.00 GiB" not in mixed_run.stdout
    assert "(dev 0, small)" in mixed_run.html and "/ 64" not in mixed_run.html


def test_tightest_memory_takes_each_devices_own_capacity():
    from paraplan.report.tables import memory_text, tightest_memory

    row = auto.Row(planner="x", status="ok", peak_bytes=(int(31.92 * 2**30), int(35 * 2**30)),
                   capacity_bytes=(32 * 2**30, 40 * 2**30))
    assert tightest_memory(row) == (0, int(31.92 * 2**30), 32 * 2**30)
    assert memory_text(row) == "31.92 / 32.00 GiB (dev 0)"


def test_a_one_process_plan_says_so_whichever_planner_found_it(mixed_run):
    one = Plan(model="m", cluster="c", n_layers=4, global_batch=8, n_micro=1, schedule="gpipe", grad_sync="none",
               stages=(Stage(LayerRange(0, 4), (0,)),))
    assert describe(one) == "one process on 1 device"
    split = replace(one, stages=(Stage(LayerRange(0, 2), (0,), backward_layers=LayerRange(0, 2)),
                                 Stage(LayerRange(2, 4), (0,), backward_layers=LayerRange(2, 4))))
    assert describe(split) == "one process on 1 device"  # a Bi-Partition plan of one worker
    placed = replace(one, schedule="dag", stages=(), operators=(OperatorPlacement(0, ("a", "b")),
                                                               OperatorPlacement(1, ())))
    assert describe(placed) == "one process on 1 device"
    # Bi-Partition's one worker (csimd splits in two since it prices the second, faster device as
    # itself: 4.58 ms against 7.12 for one process, issue 52)
    rows = [line for line in mixed_run.stdout.splitlines() if re.match(r"│ (bipartition|pipedream-layerwise) ", line)]
    assert len(rows) == 2 and all("one process on 1 device" in line for line in rows)
    assert "1 worker" not in mixed_run.stdout and "operators on 1 devices" not in mixed_run.stdout


def test_the_report_says_it_is_being_written_and_how_long_it_took(mixed_run, tmp_path, monkeypatch):
    import paraplan.report.html
    from paraplan.cli.plan_auto import _write_report

    assert re.search(r"report written to \S+index\.html in \d+\.\d s", mixed_run.stdout)
    said = []

    class Err:  # the stderr console: its status line while the report is drawn
        def status(self, text):
            said.append(text)
            return contextlib.nullcontext()

    monkeypatch.setattr(paraplan.report.html, "write_report", lambda result, cm, out, flops: Path(out) / "index.html")
    args = SimpleNamespace(report=str(tmp_path / "r"), json=True)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        _write_report(args, None, None, Err())
    assert said == [f"writing the report into {tmp_path / 'r'}"]
    assert re.fullmatch(r"report written to \S+index\.html in \d+\.\d s\n", err.getvalue())  # --json: not on stdout


def test_the_console_and_the_report_count_the_same_plans_in_the_same_words(mixed_run):
    said = re.search(r"\d+ plans? compared, from \d+ planners?, in [\d.]+ s", mixed_run.stdout)
    assert said and said.group(0) in mixed_run.html
    assert "planners compared in" not in mixed_run.html


# ----- 4. paraplan clusters -------------------------------------------------------------------------

def test_clusters_show_the_peak_of_the_default_precision_and_name_it(capsys):
    res = run_cli_here(capsys, "clusters")
    assert res.returncode == 0, res.stderr
    h100 = next(line for line in res.stdout.splitlines() if "dgx-h100-80gb" in line)
    assert "989 TFLOP/s bf16" in h100 and "67 TFLOP/s" not in h100
    csimd = next(line for line in res.stdout.splitlines() if "csimd-v100-1gbe" in line)
    assert "14 TFLOP/s fp32" in csimd


# ----- 6. errors of a prediction, one way --------------------------------------------------------------

def test_an_error_is_measured_against_predicted_everywhere(capsys):
    from paraplan.cli.plan_runs import print_proof
    from paraplan.cli.train import drift_warning
    from paraplan.runtime.launcher.prove import Measured
    from paraplan.runtime.measure.compare import Comparison, against_prediction

    slow = Comparison(predicted_s=0.1, measured_median_s=0.204, measured_q1_s=0.2, measured_q3_s=0.21, steps=8)
    assert slow.error == pytest.approx(1.04)
    assert against_prediction(0.1, 0.204) == "measured 2.04x the prediction (+104%)"
    assert against_prediction(0.1, 0.05) == "measured 0.50x the prediction (-50%)"
    assert Measured("a", 0.1, (0.204,)).error == pytest.approx(1.04)
    line = drift_warning(slow.error, "analytic preset local")
    assert "measured 2.04x the prediction (+104%)" in line and "off the prediction" not in line
    print_proof([Measured("chosen", 0.1, (0.204,)), Measured("one process", 0.2, (0.3,))], "csimd")
    out = capsys.readouterr().out
    assert "2.04x (+104%)" in out and "1.50x (+50%)" in out


def test_no_source_says_an_error_is_off_the_prediction():
    src = Path(__file__).resolve().parents[2] / "src" / "paraplan"
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert "off the prediction" not in text and "error of the prediction" not in text, path


# ----- 7. one unit per column, no negative zero ------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    """A real comparison of a few planners on gpt2-tiny, and its cost model."""
    from paraplan.workload import workload

    w = workload("gpt2-tiny", "local", batch=8)
    return auto.compare(w.request, planners=["csimd", "dp", "even", "bipartition"], time_limit_s=60), w.request.costs


def test_a_time_column_has_one_unit_and_a_bubble_is_never_negative_zero(small):
    from paraplan.report.html import render
    from paraplan.report.tables import auto_table, percent

    assert percent(-1e-17) == "0%" and percent(-0.0004, 1) == "0.0%" and percent(-0.2) == "-20%"
    comparison, costs = small
    rows = list(comparison.rows)
    ok = [i for i, r in enumerate(rows) if r.status == "ok"]
    assert len(ok) >= 2
    rows[ok[0]] = replace(rows[ok[0]], iteration_s=12.072, bubble=-1e-17)  # beside rows of milliseconds
    result = replace(comparison, rows=tuple(rows))
    table = auto_table(result, "t")
    iteration = [c for c in table.columns[3]._cells if c]
    assert len({c.split()[-1] for c in iteration}) == 1 and not any("e+" in c for c in iteration)
    assert "-0%" not in table.columns[6]._cells
    page = re.sub(r'src="data:[^"]*"', 'src=""', render(result, costs))  # the text, not the figures' bytes
    assert "-0%" not in page and "e+0" not in page
    from test_report_html import Page

    cells = [r["cells"][4] for r in Page(page).rows if r["cells"][4] != "—"]  # the iteration column
    assert len(cells) >= 2 and len({c.split()[-1] for c in cells}) == 1
    assert "-0%" not in [r["cells"][8] for r in Page(page).rows]  # the bubble column
