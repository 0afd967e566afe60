"""The user guide's commands run as written (tests/distributed/guide_commands.py), every page but the one
on measuring and the LLM quick start, which test_guide_measure.py runs (so that the two pytest workers share them)."""

import pytest

from .guide_commands import GUIDE, commands, page_problems, pages, paraplan_argv, run_page

PAGES = [p for p in pages() if p.name not in ("measure.md", "llm-quickstart.md")]  # test_guide_measure.py runs those


def test_the_guide_has_pages_and_commands():
    names = {p.relative_to(GUIDE).as_posix() for p in pages()}
    assert {"README.md", "cluster.md", "measure.md", "report.md", "torchrun.md", "methods/csimd.md",
            "methods/gropipe.md", "methods/galvatron.md", "methods/fddps.md", "methods/bipartition.md",
            "llm-bf16.md", "schedules.md", "moe.md", "fp8.md", "mixed.md", "failures.md"} <= names
    assert all(commands(p) for p in pages()), "a guide page without a command to run"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(GUIDE).as_posix() for p in PAGES])
def test_every_command_of_the_page_runs(page, tmp_path):
    problems = page_problems(page, run_page(page, tmp_path))
    assert not problems, "\n".join(problems)


def test_only_plain_paraplan_commands_are_forked():
    """What runs forked (paraplan_argv) rather than in bash: words and quoted strings, an `&` inside
    quotes included; any unquoted operator or expansion goes to bash."""
    assert paraplan_argv('paraplan plan --model "hf:llama?a=1&b=2" --out x.json') == \
        (["plan", "--model", "hf:llama?a=1&b=2", "--out", "x.json"], False)
    assert paraplan_argv('paraplan export p.json --to torchtitan || echo "exit status $?"') == \
        (["export", "p.json", "--to", "torchtitan"], True)
    for shell in ("paraplan plan --out $HOME/x.json", "paraplan plan & wait", "paraplan plan > out.txt",
                  "paraplan plan | head", "paraplan plan; ls", "paraplan plan || echo no", "torchrun -m paraplan",
                  'paraplan plan --model "unclosed'):
        assert paraplan_argv(shell) is None, shell
