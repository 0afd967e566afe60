"""Run the user guide's commands (docs/guide/**.md) as written: every line starting with `$ ` in a
```console block, one page's commands in order in a directory of its own (a later command reads
what an earlier one wrote), the repository's examples/ beside them, .venv/bin first on PATH.
Exit 0 and no traceback for each. Shared by test_guide_commands.py and test_guide_measure.py,
which split the pages between the two pytest workers.

A plain `paraplan ARGS` line (words and quoted strings, optionally `|| echo "exit status $?"` after
it) runs as a process forked from a warm one (tests/paraplan_process.py: the same argv, directory,
environment, exit status and output, without 4-6 s of imports each); anything else (torchrun, a
loop) runs in bash as written.
tests/unit/test_readme_commands.py starts the installed entry points themselves."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from paraplan_process import run_paraplan

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
       "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def pages() -> list[Path]:
    return sorted(GUIDE.rglob("*.md"))


def commands(page: Path) -> list[str]:
    out = []
    for block in re.findall(r"^```console\n(.*?)^```", page.read_text(), re.S | re.M):
        out += [line[2:].strip() for line in block.splitlines() if line.startswith("$ ")]
    return out


def paraplan_argv(command: str) -> tuple[list[str], bool] | None:
    """`paraplan ARGS` (words and quoted strings only: no unquoted operator, no expansion), optionally
    followed by `|| echo "exit status $?"`: (ARGS, whether the echo follows); None for anything else."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: bash's to report
        return None
    or_echo = tokens[-3:] == ["||", "echo", "exit status $?"]
    if or_echo:
        tokens = tokens[:-3]
    # punctuation_chars makes every unquoted operator a token of its own
    if not tokens or tokens[0] != "paraplan" or any(re.fullmatch(r"[|;&<>()]+", t) for t in tokens) \
            or any(c in command.split("||")[0] for c in "$`\\"):
        return None
    return tokens[1:], or_echo


def run_page(page: Path, tmp: Path) -> list[tuple[str, int, str]]:
    """(command, exit status, its output) for each command of the page, in order; stops at the
    first that fails (a later command may read what it should have written)."""
    (tmp / "examples").symlink_to(ROOT / "examples")
    ran = []
    for command in commands(page):
        forked = paraplan_argv(command)
        if forked is not None:
            argv, or_echo = forked
            res = run_paraplan(*argv, cwd=tmp, env=ENV, timeout=900)
            if or_echo and res.returncode != 0:  # `|| echo "exit status $?"` as bash runs it
                res.stdout += f"exit status {res.returncode}\n"
                res.returncode = 0
        else:
            res = subprocess.run(["bash", "-c", command], cwd=tmp, env=ENV, capture_output=True, text=True,
                                 timeout=900)
        ran.append((command, res.returncode, res.stdout[-60000:] + res.stderr[-3000:]))
        if res.returncode != 0:
            break
    return ran


def page_problems(page: Path, ran: list[tuple[str, int, str]]) -> list[str]:
    """What is wrong with a page's run (`run_page`): a command that did not run (an earlier one
    failed), a non-zero exit status or a traceback, each with the command's output; [] when clean."""
    problems = [f"{len(commands(page)) - len(ran)} of the page's commands not run"] if len(ran) != len(commands(page)) \
        else []
    for command, status, output in ran:
        if status != 0:
            problems.append(f"{command}: exit status {status}\n{output}")
        elif "Traceback" in output:
            problems.append(f"{command}: a traceback\n{output}")
    return problems
