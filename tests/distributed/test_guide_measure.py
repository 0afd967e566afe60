"""The user guide's page on profiling and calibrating runs as written: profile, calibrate --quick,
plan with --prove (real processes), about 1.5 minutes on a quiet machine here (calibrate --quick about 50 s of it)."""

from .guide_commands import GUIDE, commands, run_page


def test_the_measuring_page_runs(tmp_path):
    page = GUIDE / "measure.md"
    ran = run_page(page, tmp_path)
    assert len(ran) == len(commands(page))
    for command, status, output in ran:
        assert status == 0, f"{command}\n{output}"
        assert "Traceback" not in output, f"{command}\n{output}"
    # the proof printed its table: predicted against measured for the three plans
    assert "proof on this machine" in ran[-1][2] and "one process" in ran[-1][2]
