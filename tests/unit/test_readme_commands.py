"""Every `paraplan ...` command in README.md runs: the fenced examples as written, the table's
synopses with their required arguments filled in (optional `[...]` parts left out), and
`paraplan <subcommand> --help` for every subcommand. Exit 0, no traceback.

Each command runs in a temporary directory of its own, so whatever it writes (plan.json,
gantt.png, runs/...) lands there; `examples/...` and a plan file it reads point at the repository.
The commands run two at a time (this machine has two cores), each a process of its own forked from a
warm one (tests/paraplan_process.py: the same argv, cwd, environment, exit status and output, without
4-6 s of imports per command); test_the_installed_entry_points_start starts the console script and
`python -m paraplan` themselves. SLOW lists what is left out and why.
"""

import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from paraplan_process import run_paraplan

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
# the table's placeholders, filled with something small that runs here in seconds
PLACEHOLDERS = {"MODEL": "lenet-5", "M": "gpt2-tiny", "C": "local", "B": "8", "PAPER": "bipartition"}
# a plan a command reads (simulate plan.json, train --plan plan.json): one that trains on this machine
PLAN_INPUT = ROOT / "examples" / "gpt2-tiny-local-1f1b-2x4.json"
# commands left out (unless PARAPLAN_README_ALL=1), with why: the test is kept to about 40 s on two cores
SLOW: dict[str, str] = {} if os.environ.get("PARAPLAN_README_ALL") else {
    "fenced: paraplan inspect gpt3-175b --batch 1 --cluster galvatron-64xa100":
        "measuring GPT-3 175B's 98 layers on meta takes about 11 s of CPU, a quarter of this test; "
        "`inspect` runs here on lenet-5 (the table's row); PARAPLAN_README_ALL=1 runs it too",
    "fenced: paraplan plan --model gpt2-xl --cluster galvatron-8xtitan --batch 64 --memory 16GiB --report report/":
        "every planner on GPT-2 XL (~30 s of two cores); `make demo` runs this same command, and the table's "
        "row runs the comparison on gpt2-tiny here",
    "table: paraplan calibrate [--quick] [--devices N] [--out local-calibrated.toml]":
        "the synopsis without its options is the full calibration (minutes of both cores); tests/distributed/test_guide_measure.py runs `calibrate --quick` "
        "as the user guide writes it, and make demo runs it too",
    "table: paraplan plan --model M --cluster C --batch B --prove [--prove-rounds 3]":
        "nine real training runs after the comparison (~1 minute); tests/distributed/test_guide_measure.py runs "
        "`plan --prove` as the user guide writes it",
    "table: paraplan models":
        "builds every zoo entry on meta (~6 s of a core); tests/unit/test_cli.py runs `paraplan models --json`, "
        "the same listing, and checks it",
    "table: paraplan bench paper PAPER [--out DIR]":
        "runs two benchmark scripts (~25 s); tests/unit/test_bench_paper.py runs exactly this command",
}


def _fenced() -> list[str]:
    commands = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", README.read_text(), re.S | re.M):
        for line in block.splitlines():
            line = re.sub(r"^\$\s*", "", line.split(" #")[0].strip())
            line = re.sub(r"^(\S*/)?paraplan\b|^python -m paraplan\b", "paraplan", line)
            if line.startswith("paraplan "):
                commands.append(line)
    return commands


def _table() -> list[str]:
    rows = re.findall(r"^\| `(paraplan [^`]*)` \|", README.read_text(), re.M)
    return [row.replace("\\|", "|") for row in rows]


def _argv(command: str, synopsis: bool) -> list[str]:
    if synopsis:  # the required part of a synopsis, its placeholders filled in
        command = re.sub(r"\[[^\]]*\]", " ", command)
    argv = shlex.split(command)[1:]
    out = []
    for i, arg in enumerate(argv):
        if synopsis and re.fullmatch(r"[A-Z][A-Z_]*", arg):
            assert arg in PLACEHOLDERS, f"README synopsis {command!r} uses {arg}: add it to PLACEHOLDERS"
            arg = PLACEHOLDERS[arg]
        elif arg.startswith(("examples/", "tests/data/")):
            arg = str(ROOT / arg)
        elif arg == "plan.json" and (i == 1 or argv[i - 1] == "--plan"):  # read, not written
            arg = str(PLAN_INPUT)
        out.append(arg)
    return out


def _subcommands() -> list[str]:
    import argparse

    from paraplan.cli import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(actions[0].choices)


COMMANDS = ([(f"fenced: {c}", _argv(c, synopsis=False)) for c in _fenced()]
            + [(f"table: {c}", _argv(c, synopsis=True)) for c in _table()]
            + [(f"help: paraplan {s} --help", [s, "--help"]) for s in _subcommands()])


def test_the_readme_has_commands():
    kinds = {name.split(":")[0] for name, _ in COMMANDS}
    assert kinds == {"fenced", "table", "help"}
    assert len(_table()) >= 8 and len(_fenced()) >= 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run every command (two at a time), each in a directory of its own."""

    def one(item):
        cwd, (name, argv) = item
        t0 = time.perf_counter()
        res = run_paraplan(*argv, env=ENV, cwd=cwd, timeout=120)
        return name, (res, cwd, time.perf_counter() - t0)

    # The directories are made here, in this thread: tmp_path_factory is not thread-safe (two threads
    # creating the worker's base directory at once raised FileExistsError on a fresh machine).
    todo = [(tmp_path_factory.mktemp(f"readme{i}"), c) for i, c in enumerate(COMMANDS) if c[0] not in SLOW]
    # the slowest first, so that the two workers finish together
    todo.sort(key=lambda item: ("help:" in item[1][0], " train " not in item[1][0]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, todo))


@pytest.mark.parametrize("name", [name for name, _ in COMMANDS])
def test_readme_command_runs(results, name):
    if name in SLOW:
        pytest.skip(SLOW[name])
    res, cwd, seconds = results[name]
    assert res.returncode == 0, f"{name}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    argv = dict(COMMANDS)[name]
    if argv[0] == "train" and "--help" not in argv and "--out-dir" not in argv:  # ./runs/<date>-<time>
        assert list(cwd.glob("runs/*/losses.json")), list(cwd.rglob("*"))


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_the_installed_entry_points_start(entry, tmp_path):
    """The rest of this file forks `paraplan.cli.main` from a warm process: here the two ways a user
    starts paraplan, as installed, run a README command (the table's `paraplan clusters`)."""
    start = [str(Path(sys.executable).parent / "paraplan")] if entry == "console script" else [sys.executable, "-m", "paraplan"]
    res = subprocess.run([*start, "clusters"], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "galvatron-8xtitan" in res.stdout and "Traceback" not in res.stderr
