"""The HTML report of `paraplan plan --planner auto --report DIR`: one self-contained page, built
from a real comparison of planners on tiny GPT-2 (plans, simulations and figures are real)."""

import base64
import io
import os
from html.parser import HTMLParser

import matplotlib.image
import pytest

from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, source
from paraplan.models.op_trace import build_op_graph
from paraplan.planners import auto
from paraplan.planners.request import PlanRequest
from paraplan.report.html import fmt_bytes, fmt_time, write_report

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PNG = b"\x89PNG\r\n\x1a\n"
CLUSTER = "galvatron-8xtitan"


class Page(HTMLParser):
    """What the tests read off the page: images, table rows, the verdict, every URL."""

    def __init__(self, text: str):
        super().__init__()
        self.imgs: list[str] = []
        self.urls: list[str] = []
        self.rows: list[dict] = []  # the comparison table's rows (the first tbody): class and cell texts
        self.peak_rows: list[dict] = []  # the chosen plan's memory at each peak, by category (a later tbody)
        self._tbodies = 0
        self.verdict = ""
        self._in_tbody = self._in_verdict = 0
        self._cell: list[str] | None = None
        self.scripts = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if key in a:
                self.urls.append(a[key])
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        elif tag == "script":
            self.scripts += 1
        elif tag == "tbody":
            self._in_tbody = 1
            self._tbodies += 1
        elif tag == "tr" and self._in_tbody:
            (self.rows if self._tbodies == 1 else self.peak_rows).append({"class": a.get("class", ""), "cells": []})
        elif tag == "td" and self._in_tbody:
            self._cell = []
        elif tag == "div" and "verdict" in a.get("class", ""):
            self._in_verdict = 1
        elif tag == "div" and self._in_verdict:
            self._in_verdict += 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_tbody = 0
        elif tag == "td" and self._cell is not None:
            (self.rows if self._tbodies == 1 else self.peak_rows)[-1]["cells"].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "div" and self._in_verdict:
            self._in_verdict -= 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_verdict:
            self.verdict += data


@pytest.fixture(scope="module")
def cm():
    built = source.build("gpt2-tiny", device="meta")
    return analytic_cost_model(measure.measure(built), load_cluster(CLUSTER), operators=build_op_graph(built))


def _request(cm, **kw):
    return PlanRequest(costs=cm, model_name="gpt2-tiny", cluster_name=CLUSTER, batch=16, **kw)


@pytest.fixture(scope="module")
def mixed(cm):
    """Pipeline, Galvatron, Bi-Partition, data-parallel and operator-placement plans, and a planner
    that crashes (inherited by the forked planner processes)."""
    real = auto.make_plan

    def make_plan(request, name, **kwargs):
        if name == "gropipe":
            raise RuntimeError("boom")
        return real(request, name, **kwargs)

    auto.make_plan = make_plan
    try:
        return auto.compare(_request(cm), planners=["csimd", "gropipe", "galvatron-bmw", "bipartition", "dp", "heft"],
                            time_limit_s=60)
    finally:
        auto.make_plan = real


@pytest.fixture(scope="module")
def mixed_page(cm, mixed, tmp_path_factory):
    """The report of `mixed`, written once into a directory that does not exist yet."""
    out = tmp_path_factory.mktemp("report") / "new" / "report"
    return out, write_report(mixed, cm, out)


def _check_images(page: Page) -> None:
    assert page.imgs
    for src in page.imgs:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(PNG) and len(data) < 300_000
        pixels = matplotlib.image.imread(io.BytesIO(data), format="png")
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 300
        assert pixels.std() > 0.01  # something is drawn


def _self_contained(text: str, page: Page) -> None:
    assert all(u.startswith("data:") for u in page.urls), page.urls
    assert "http://" not in text and "https://" not in text and "url(" not in text and page.scripts == 0


def test_the_report_is_one_self_contained_page(mixed_page):
    out, path = mixed_page
    assert path == out / "index.html"
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]  # no temporary files left behind
    text = path.read_text()
    page = Page(text)
    _self_contained(text, page)
    _check_images(page)
    # two timelines, two memory charts, strategies, Bi-Partition ranges, the bound
    assert len(page.imgs) == 7, [src[:40] for src in page.imgs]
    assert "gpt2-tiny on galvatron-8xtitan, global batch 16" in text


def test_the_table_has_every_row_sorted_with_the_best_highlighted(mixed, mixed_page):
    page = Page(mixed_page[1].read_text())
    assert mixed.best is not None and mixed.row("gropipe").status == "failed"
    assert len(page.rows) == len(mixed.rows)
    names = [r["cells"][0].removesuffix("chosen").strip() for r in page.rows]
    statuses = [r["cells"][1] for r in page.rows]
    assert sorted(names) == sorted(r.planner for r in mixed.rows)
    ok = [r.planner for r in mixed.ranked]
    assert names[:len(ok)] == ok and statuses[-1] == "failed" and names[-1] == "gropipe"
    assert [r["class"] for r in page.rows].count("best") == 1 and page.rows[0]["class"] == "best"
    assert "boom" in page.rows[-1]["cells"][-1]
    best = mixed.row(mixed.best)
    from paraplan.report.tables import in_unit, seconds_unit  # the iteration column's one unit

    assert page.rows[0]["cells"][4] == in_unit(best.iteration_s, seconds_unit(r.iteration_s for r in mixed.rows))
    # the chosen plan's memory at each stage's peak, by category: heaviest first, one row per stage
    assert len(page.peak_rows) == best.plan.n_stages
    assert all(r["cells"][2] in ("forward/backward", "optimizer step") for r in page.peak_rows)


def test_the_verdict_names_the_winner_and_the_runner_up(mixed, mixed_page):
    page = Page(mixed_page[1].read_text())
    best, second = mixed.ranked[:2]
    assert f"{best.planner} is chosen" in page.verdict
    assert best.shape in page.verdict and fmt_time(best.iteration_s) in page.verdict
    assert f"runner-up, {second.planner}" in page.verdict
    gap = best.iteration_s / mixed.bound.iteration_s - 1
    assert f"{gap:.1%} above the lower bound of {fmt_time(mixed.bound.iteration_s)}" in page.verdict


def test_the_report_says_what_users_compare_runs_by(mixed, tmp_path, cm):
    """Issue 49: MFU beside samples/s in the table, tokens/s, TFLOP/s and MFU per GPU in the verdict."""
    from paraplan.costs.model_flops import model_flops, plan_achieved
    from paraplan.engines.shape import model_shape

    shape = model_shape("gpt2-tiny")
    flops = model_flops(cm.model, layers=shape.layers, hidden=shape.hidden)
    page = Page(write_report(mixed, cm, tmp_path / "r", flops).read_text())
    best = mixed.row(mixed.best)
    a = plan_achieved(flops, best.plan, cm.cluster, best.throughput)
    assert f"Per GPU: {a.tokens_per_s_per_gpu:,.0f} tokens/s, " in page.verdict
    assert f"MFU {a.mfu:.1%} (of the fp32 peak" in page.verdict and "6*N + 6*L*d*s per token" in page.verdict
    assert page.rows[0]["cells"][6] == f"{a.mfu:.1%}"  # the MFU column, beside samples/s
    assert all(r["cells"][6] == "—" for r in page.rows if r["cells"][5] == "—")


def test_an_operator_placement_winner_gets_its_gantt(tmp_path, cm):
    result = auto.compare(_request(cm), planners=["heft", "fddps"], time_limit_s=60)
    assert result.best is not None and result.row(result.best).plan.schedule == "dag"
    text = write_report(result, cm, tmp_path).read_text()
    page = Page(text)
    _check_images(page)
    assert 'alt="timeline of heft"' in text and 'alt="timeline of fddps"' in text
    assert "No timeline" not in text


def test_a_comparison_where_nothing_fits_still_writes_a_page(tmp_path, cm):
    result = auto.compare(_request(cm, memory_bytes=2**20), planners=["csimd", "dp", "bipartition"], time_limit_s=60)
    assert result.best is None
    text = write_report(result, cm, tmp_path).read_text()
    page = Page(text)
    _self_contained(text, page)
    assert "Nothing fits" in page.verdict and "is chosen" not in page.verdict
    assert len(page.rows) == len(result.rows) and not any(r["class"] == "best" for r in page.rows)
    assert "Timelines" not in text  # nothing to show a timeline of
    _check_images(page)  # the closest plan's memory, over capacity


def test_a_report_directory_that_is_a_file_is_refused(tmp_path, cm, mixed):
    from paraplan.errors import ParaplanError

    (tmp_path / "taken").write_text("")
    with pytest.raises(ParaplanError, match="not a directory"):
        write_report(mixed, cm, tmp_path / "taken")


def test_numbers_are_formatted_for_people():
    assert fmt_time(0.000594) == "594 µs" and fmt_time(0.71854) == "719 ms" and fmt_time(4.0194) == "4.02 s"
    assert fmt_time(None) == "—"
    assert fmt_bytes(15.96 * 2**30) == "15.96 GiB" and fmt_bytes(16 * 2**30) == "16 GiB"
    assert fmt_bytes(517.9 * 2**20) == "517.9 MiB" and fmt_bytes(12) == "12 B"
