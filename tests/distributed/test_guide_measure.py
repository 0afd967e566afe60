"""The user guide's page on profiling and calibrating runs as written: profile, calibrate --quick,
plan with --prove (real processes), about 2.5 minutes on this machine."""

from .guide_commands import GUIDE, run_page


def test_the_measuring_page_runs(tmp_path):
    run_page(GUIDE / "measure.md", tmp_path)
