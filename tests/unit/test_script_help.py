"""Every script a user can run answers `--help` without doing the work, and refuses an argument it
does not know (exit status 2) before doing any (issue 46: `benchmarks/published_runs.py --help`
started the 17-minute benchmark). A script is a .py file outside src/ and tests/ with a
`__name__ == "__main__"` block: the benchmarks and the examples. Each runs as a process of its own,
in a temporary directory with PARAPLAN_BENCH_OUT pointing there, so that a script that did start its
work would write nothing into the repository (and be stopped by the timeout)."""

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from paraplan_process import run_script

ROOT = Path(__file__).resolve().parents[2]
NOT_SCRIPTS = {"src", "tests", "results", "bench-out", "build"}  # the package, the tests, outputs
TIMEOUT_S = 10  # a help is imports and a parser: well under a second each here, several under load


def scripts() -> list[Path]:
    found = []
    for folder in sorted(ROOT.iterdir()):
        if folder.is_dir() and folder.name not in NOT_SCRIPTS and not folder.name.startswith("."):
            found += [p for p in sorted(folder.rglob("*.py"))
                      if re.search(r"""^if __name__ == ["']__main__["']""", p.read_text(), re.M)]
    return found


def run(script: Path, arg: str, tmp: Path) -> tuple[int, str, str]:
    """`python SCRIPT ARG` in `tmp`, forked from a warm process (tests/paraplan_process.py: its own
    process, directory, environment and exit status, without each script's 0.3-1 s of imports)."""
    env = {**os.environ, "PARAPLAN_BENCH_OUT": str(tmp), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    try:
        res = run_script(script, arg, cwd=tmp, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, "", f"still running after {TIMEOUT_S} s: it started its work"
    return res.returncode, res.stdout, res.stderr


def takes_positionals(script: Path) -> bool:
    """Its parser has a positional argument (`MODEL:BATCH ...`), where an unknown option is worth
    trying for real; of the others it is enough that they read no sys.argv of their own."""
    return bool(re.search(r"""add_argument\(\s*["'][^-]""", script.read_text()))


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """(script, argument) -> (exit status, stdout, stderr), two processes at a time (two cores)."""
    todo = [(script, arg, tmp_path_factory.mktemp(script.stem))
            for script in scripts() for arg in ("--help", "--no-such-option")
            if arg == "--help" or takes_positionals(script)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda item: run(*item), todo))
    return {(script.relative_to(ROOT).as_posix(), arg): res for (script, arg, _), res in zip(todo, results, strict=True)}


def test_the_scripts_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in scripts()}
    assert {"benchmarks/published_runs.py", "benchmarks/csimd_eval.py", "benchmarks/stress_teardown.py"} <= names
    assert len([n for n in names if n.startswith("benchmarks/")]) >= 25
    # the runnable benchmarks `make bench` runs are all scripts
    make = (ROOT / "Makefile").read_text()
    listed = re.search(r"^BENCHMARKS := (.*?)\n\n", make, re.S | re.M).group(1).replace("\\", " ").split()
    assert {f"benchmarks/{b}.py" for b in listed} <= names


def test_every_script_answers_help_without_working(answers):
    wrong = []
    for (name, arg), (code, out, err) in sorted(answers.items()):
        if arg != "--help":
            continue
        if code != 0 or not out.startswith("usage: "):
            wrong.append(f"{name} --help: exit {code}, {(err or out).strip().splitlines()[-1:] or 'no output'}")
        elif name.startswith("benchmarks/") and "PARAPLAN_BENCH_OUT" not in out:
            wrong.append(f"{name} --help: does not say where it writes (PARAPLAN_BENCH_OUT)")
    assert not wrong, "\n".join(wrong)


def test_every_script_refuses_an_unknown_option(answers):
    tried = {name for name, arg in answers if arg != "--help"}
    assert {"benchmarks/fddps_contention.py", "benchmarks/fddps_search_speed.py"} <= tried
    wrong = [f"{name} {arg}: exit {code}, {(err or out).strip().splitlines()[-1:] or 'no output'}"
             for (name, arg), (code, out, err) in sorted(answers.items())
             if arg != "--help" and not (code == 2 and "unrecognized arguments: --no-such-option" in err)]
    # the others parse with argparse's parse_args (which refuses what it does not know, exit 2) and
    # read no arguments around it
    for script in scripts():
        code = script.read_text()
        if re.search(r"sys\.argv|parse_known_args", code):
            wrong.append(f"{script.relative_to(ROOT)}: reads sys.argv or parse_known_args (unknown options pass)")
    assert not wrong, "\n".join(wrong)
