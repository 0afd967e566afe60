"""`paraplan bench paper NAME`: the reproduction scripts run into one directory and an index page
that shows what they wrote (Bi-Partition's: ~25 s, the quickest of the five papers)."""

import os
from html.parser import HTMLParser
from pathlib import Path

from paraplan_process import run_paraplan

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs, self.h2 = [], []
        self._h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.srcs.append(a["src"])
        self._h2 = tag == "h2"

    def handle_data(self, data):
        if self._h2:
            self.h2.append(data)
            self._h2 = False


def test_bipartition_reproduction_with_its_index(tmp_path):
    out = tmp_path / "results"
    res = run_paraplan("bench", "paper", "bipartition", "--out", str(out),
                         env=ENV, timeout=600)
    assert res.returncode == 0, res.stderr
    assert (out / "bipartition_modes" / "modes.json").exists() and (out / "gropipe_bipartition" / "summary.md").exists()
    # each script's own output is kept beside its results (some scripts run for an hour)
    log = (out / "logs" / "bipartition_modes.log").read_text()
    assert log.strip() and "bipartition_modes.log" in res.stdout
    page = (out / "index.html").read_text()
    parser = _Links()
    parser.feed(page)
    # the script that reproduces Bi-Partition's Fig. 8 also writes GroPipe's tables: both sections show
    assert any("Bi-Partition" in h for h in parser.h2) and any("GroPipe" in h for h in parser.h2)
    assert parser.srcs and all((out / src).exists() for src in parser.srcs)
    assert "modes.png" in " ".join(parser.srcs)
    assert "| model |" in page or "|---|" in page  # the summaries' tables are on the page


def test_unknown_paper_is_one_line(tmp_path):
    res = run_paraplan("bench", "paper", "nope", "--out", str(tmp_path / "r"),
                         env=ENV, timeout=120)
    assert res.returncode == 2 and "unknown paper 'nope'" in res.stderr and res.stderr.count("\n") == 1
    assert not Path(tmp_path / "r").exists()
