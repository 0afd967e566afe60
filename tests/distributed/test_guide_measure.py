"""The user guide's page on profiling and calibrating runs as written: profile, calibrate --quick,
plan with --prove (real processes), about 1.5 minutes on a quiet machine here (calibrate --quick about 50 s of it);
and the LLM quick start (a comparison of Llama 3.1 8B on 16 H100, about a minute): in this file so
that the two pytest workers share the guide's pages (test_guide_commands.py runs the others)."""

from .guide_commands import GUIDE, page_problems, run_page


def test_the_measuring_page_runs(tmp_path):
    page = GUIDE / "measure.md"
    ran = run_page(page, tmp_path)
    assert not page_problems(page, ran), "\n".join(page_problems(page, ran))
    # the proof printed its table: predicted against measured for the three plans
    assert "proof on this machine" in ran[-1][2] and "one process" in ran[-1][2]


def test_the_llm_quick_start_runs(tmp_path):
    page = GUIDE / "llm-quickstart.md"
    ran = run_page(page, tmp_path)
    assert not page_problems(page, ran), "\n".join(page_problems(page, ran))
    # what the page says the user reads: the recipes' row judged, the best plan torchtitan runs named,
    # the per-GPU figures beside the launch
    assert "torchtitan-recipes" in ran[0][2] and "MFU" in ran[0][2]
    assert "torchtitan: the best plan it can run is" in ran[0][2]
    assert "per GPU:" in ran[1][2] and "--nproc-per-node 8 --nnodes 2" in ran[1][2]
