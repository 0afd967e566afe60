"""Every `paraplan` command, subcommand and flag that README.md, docs/*.md and docs/guide/ name is one
the command line accepts: parse only, nothing runs (test_readme_commands.py and
tests/distributed/test_guide_commands.py run the commands for real).

What is read:
- fenced code blocks: in a block with `$ ` prompts, the prompted lines; in a block without, the lines
  that start a command (`paraplan`, `.venv/bin/paraplan`, `python -m paraplan`, `torchrun ... -m
  paraplan`, `srun bash -c '...'`); `\\` and indented `[...]` lines continue a command;
- inline code: `paraplan SUB ...`, `SUB --flag ...` (SUB a subcommand) and bare `--flag [value]`.

What is checked, each failure named by file:line:
- the subcommand exists, and every `--flag` of a command is that subcommand's (exactly: argparse's
  abbreviations are not taken), with its value where the value is written out (a choice of the
  parser, a name the command checks later: planner, schedule, engine, mode, method, schedule list;
  or the parser's type: int, float, batch, memory size);
- a command line without placeholders (`PLAN`, `<N>`, `...`, `[optional]`, `a|b`, `$VAR`) parses
  with `build_parser().parse_args` as it stands;
- a bare `--flag` in prose is on a subcommand the same sentence names in inline code (`paraplan
  train`, `train --compare`, `` `simulate` ``), or, where the sentence names none, on at least one
  subcommand (a sentence about one command that names another flag writes it with its own:
  `train --overheads`). Other tools' flags (torchrun, torchtitan, Megatron-LM, DeepSpeed) are
  FOREIGN.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guide").rglob("*.md"))]


# flags of the other programs the docs show beside paraplan's (no paraplan subcommand has them)
FOREIGN_PREFIXES = ("--parallelism.", "--training.", "--section.", "--compile.")  # torchtitan's --section.key overrides
FOREIGN = {
    # torchrun
    "--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port", "--rdzv-backend",
    "--rdzv-endpoint", "--max-restarts", "--rdzv-conf",
    # torchtitan (besides --section.key)
    "--config",
    # Megatron-LM
    "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--seq-length", "--swiglu",
    "--normalization", "--position-embedding-type", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
    "--group-query-attention", "--num-query-groups", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--ckpt-format", "--sequence-parallel", "--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-layout",
    "--micro-batch-size", "--global-batch-size", "--recompute-granularity", "--recompute-modules", "--recompute-method",
    "--recompute-num-layers", "--bf16", "--fp16", "--torch-fsdp2-no-reshard-after-forward", "--no-rope-fusion",
    "--fp8-format", "--fp8-recipe", "--fp8-param-gather",
    "--DDP-impl", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--overlap-grad-reduce",
    "--overlap-param-gather", "--attention-dropout", "--hidden-dropout", "--norm-epsilon", "--rotary-base",
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-token-dispatcher-type", "--moe-grouped-gemm",
    "--overlap-moe-expert-parallel-comm", "--moe-flex-dispatcher-backend", "--tp-comm-overlap",
    # DeepSpeed
    "--deepspeed_config",
}
# the launchers a command line in a fenced block may start with (besides paraplan itself)
LAUNCHERS = {"torchrun", "srun", "python", "python3", "for", "exec"}
SHELL_OPERATORS = {";", "&", "&&", "|", "||", ";;"}
PIPE_SENTINEL = "\x00"  # `a|b` (alternatives in a synopsis) is not a shell pipe


@dataclass(frozen=True)
class Command:
    """One paraplan command line (or part of one) as a doc writes it."""

    where: str  # file:line
    text: str
    sub: str | None  # None: the top-level parser (`paraplan --version`) or a placeholder (`paraplan COMMAND`)
    args: tuple[str, ...]  # the words after the subcommand, brackets of optional parts removed
    complete: bool  # no placeholder, no optional part: parsed strictly as written
    strict: bool = True  # False: a prose fragment (`train --compare`), flags checked but never parsed whole
    inline: bool = False  # in prose: may name a command without its required arguments (`paraplan train`)
    error: str | None = None  # the line could not be read as shell words


@dataclass(frozen=True)
class ProseFlag:
    where: str
    text: str  # the inline code, e.g. "--schedule best"
    named: frozenset[str]  # the subcommands its sentence names


# --- the parser -------------------------------------------------------------------------------------

@cache
def parser() -> argparse.ArgumentParser:
    from paraplan.cli import build_parser

    return build_parser()


@cache
def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _in(names):
    names = tuple(str(n) for n in names)
    return lambda value: None if value in names else f"expected one of {', '.join(names)}"


def _raises(check):
    def run(value):
        try:
            check(value)
        except Exception as exc:  # noqa: BLE001 - any refusal is the finding
            return str(exc)
        return None

    return run


@cache
def value_checks() -> dict[str, object]:
    """Flags whose values the commands check after parsing: the names they know."""
    from paraplan.cli.args import parse_sizes
    from paraplan.engines.layout import ENGINES
    from paraplan.planners.bipartition.planner import MODES
    from paraplan.planners.registry import planner_names
    from paraplan.planners.schedule_variants import parse_variants
    from paraplan.plans.schedules import Schedule

    return {
        "--planner": _in(("auto", *planner_names())),
        "--schedule": _in((*Schedule, "best")),
        "--engine": _in(ENGINES), "--to": _in(ENGINES),
        "--mode": _in(MODES),
        "--method": _in(("auto", "imd", "exact", "exact-time")),  # planners/csimd/planner.py's one_of("method", ...)
        "--schedules": _raises(lambda v: v == "all" or parse_variants(v)),
        "--batch-sizes": _raises(parse_sizes),
    }


def is_placeholder(word: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z]|[A-Z][A-Z_0-9]*", word) or "..." in word or "<" in word or "$" in word
                or re.search(r"[:=][A-Z][A-Z_]+$", word))


def value_problem(action: argparse.Action, flag: str, value: str) -> str | None:
    """Why the parser (or the command's own check of names) refuses this value, if it does."""
    for alternative in value.split("|"):
        if is_placeholder(alternative) or not alternative:
            continue
        if action.choices is not None and alternative not in action.choices:
            return f"{flag} {alternative}: not one of {', '.join(map(str, action.choices))}"
        check = value_checks().get(flag)
        if check is not None and (problem := check(alternative)):
            return f"{flag} {alternative}: {problem}"
        if action.type is not None and action.choices is None:
            try:
                action.type(alternative)
            except Exception as exc:  # noqa: BLE001
                return f"{flag} {alternative}: {exc}"
    return None


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)


def flag_problems(options: dict[str, argparse.Action], where_names: str, words: tuple[str, ...]) -> list[str]:
    """Each `--flag [value]` of words against one parser's options."""
    problems = []
    for i, word in enumerate(words):
        if not word.startswith("--") or word == "--":
            continue
        flag, eq, inline = word.partition("=")
        action = options.get(flag)
        if action is None:
            problems.append(f"{flag}: not an option of {where_names}")
            continue
        if not takes_value(action):
            continue
        value = inline if eq else (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else None)
        if value is not None and (problem := value_problem(action, flag, value)):
            problems.append(problem)
    return problems


# --- reading the docs ---------------------------------------------------------------------------------

def tokens(text: str) -> list[str] | None:
    """Shell words and operators (`a|b` kept as one word, `# comment` dropped); None if unbalanced."""
    text = re.sub(r"(?<=\S)\\?\|(?=\S)", PIPE_SENTINEL, text)  # README's table escapes it: \|
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        return [w.replace(PIPE_SENTINEL, "|") for w in lexer]
    except ValueError:
        return None


def is_paraplan(words: list[str], i: int) -> int:
    """How many words start a paraplan invocation at i (0: none)."""
    word = words[i]
    if word == "paraplan" or word.endswith("/paraplan"):
        return 1
    if word == "-m" and i + 1 < len(words) and words[i + 1] in ("paraplan", "paraplan.cli"):
        return 2
    return 0


def invocations(words: list[str]) -> list[list[str]]:
    """The words after each `paraplan` (up to a shell operator), quoted commands (`bash -c '...'`) included."""
    found = []
    i = 0
    while i < len(words):
        if " " in words[i] and "paraplan" in words[i]:
            found += invocations(tokens(words[i]) or [])
        start = is_paraplan(words, i)
        if start:
            j = i + start
            while j < len(words) and words[j] not in SHELL_OPERATORS:
                j += 1
            found.append(words[i + start:j])
            i = j
        i += 1
    return found


def command(where: str, text: str, words: list[str], strict: bool = True, inline: bool = False) -> Command:
    complete = strict
    args = []
    for word in words:
        if word.startswith("[") or word.endswith("]"):
            complete = False
            word = word.strip("[]")
            if not word:
                continue
        if is_placeholder(word) or "|" in word:
            complete = False
        args.append(word)
    sub = args[0] if args and not args[0].startswith("-") else None
    if sub is not None:
        args = args[1:]
        if is_placeholder(sub):
            sub, complete = None, False
    return Command(where, text, sub, tuple(args), complete, strict, inline)


def fenced_lines(lines: list[str]):
    """(line number, text) of each command line of the fenced blocks, its continuation lines joined."""
    fence = None
    block: list[tuple[int, str]] = []
    for n, line in enumerate(lines, 1):
        m = re.match(r"\s*(```+)\s*(\S*)", line)
        if m and fence is None:
            fence, lang, block = m.group(1), m.group(2), []
            continue
        if m and fence is not None and line.strip() == fence:
            yield from _block_commands(block, lang)
            fence = None
            continue
        if fence is not None:
            block.append((n, line))


def _block_commands(block: list[tuple[int, str]], lang: str):
    if lang in ("python", "toml", "json"):
        return
    prompted = any(line.lstrip().startswith("$ ") for _, line in block)
    current: tuple[int, str] | None = None
    for n, line in block:
        stripped = line.strip()
        if current is not None and (current[1].endswith("\\") or (not prompted and stripped.startswith("[")
                                                                  and line[:1].isspace())):
            current = (current[0], current[1].removesuffix("\\") + " " + stripped)
            continue
        if current is not None:
            yield current
            current = None
        if prompted:
            if stripped.startswith("$ "):
                current = (n, stripped[2:])
        elif stripped:
            first = stripped.split()[0]
            if first in LAUNCHERS or first == "paraplan" or first.endswith(("/paraplan", "/python")):
                current = (n, stripped)
    if current is not None:
        yield current


def without_fences(text: str) -> str:
    """The text with fenced blocks blanked (line numbers kept)."""
    return re.sub(r"^\s*```.*?^\s*```[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S | re.M)


def sentences(paragraph: str, start: int):
    """(offset, sentence) of a paragraph, split at '. ' outside inline code (a sentence's clauses often
    name the subcommand once for several flags: `plan`, `simulate` and `train --compare` ...; ... on
    `--cluster local`)."""
    out, begin, in_code = [], 0, False
    for i, ch in enumerate(paragraph):
        if ch == "`":
            in_code = not in_code
        elif not in_code and ch == "." and paragraph[i + 1:i + 2] in (" ", "\n", ""):
            out.append((start + begin, paragraph[begin:i + 1]))
            begin = i + 1
    out.append((start + begin, paragraph[begin:]))
    return out


def paragraphs(text: str):
    """(offset, paragraph): blank-line separated, each table row and each list item on its own."""
    offset = 0
    for chunk in re.split(r"(\n\s*\n)", text):
        if chunk.strip() and not chunk.startswith("\n"):
            pos, begin = offset, offset
            for line in chunk.splitlines(keepends=True):
                if re.match(r"\s*([|]|[-*] |\d+\. )", line) and pos > begin:  # a row or an item begins
                    yield begin, text[begin:pos]
                    begin = pos
                pos += len(line)
                if line.lstrip().startswith("|"):  # a row ends with its line
                    yield begin, text[begin:pos]
                    begin = pos
            if pos > begin:
                yield begin, text[begin:pos]
        offset += len(chunk)


def read_docs() -> tuple[list[Command], list[ProseFlag]]:
    commands: list[Command] = []
    prose: list[ProseFlag] = []
    subs = set(subparsers())
    for path in doc_files():
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        for n, line in fenced_lines(text.splitlines()):
            words = tokens(line)
            if words is None:
                commands.append(Command(f"{name}:{n}", line, None, (), False, error="unbalanced quotes"))
            for call in invocations(words or []):
                commands.append(command(f"{name}:{n}", line, call))
        bare = without_fences(text)
        for start, paragraph in paragraphs(bare):
            for offset, sentence in sentences(paragraph, start):
                spans = [(offset + m.start(), " ".join(m.group(1).split())) for m in re.finditer(r"`([^`]+)`", sentence)]
                named: set[str] = set()
                found: list[Command] = []
                flags: list[tuple[str, str]] = []
                for pos, span in spans:
                    where = f"{name}:{bare.count(chr(10), 0, pos) + 1}"
                    words = tokens(span) or []
                    if words and is_paraplan(words, 0):
                        found += [command(where, span, call, inline=True) for call in invocations(words)]
                    elif words and words[0] in subs and len(words) > 1 and words[1].startswith("--"):
                        found.append(command(where, span, words, strict=False, inline=True))
                    elif words and words[0].startswith("--"):
                        flags.append((where, span))
                    elif span in subs:
                        named.add(span)
                named |= {c.sub for c in found if c.sub}
                commands += found
                prose += [ProseFlag(where, span, frozenset(named)) for where, span in flags]
    return commands, prose


@cache
def docs() -> tuple[list[Command], list[ProseFlag]]:
    return read_docs()


# --- the checks ---------------------------------------------------------------------------------------

def command_problems(c: Command) -> list[str]:
    if c.error:
        return [c.error]
    if c.sub is None:
        options, names = parser()._option_string_actions, "paraplan"
    elif c.sub not in subparsers():
        return [f"no subcommand {c.sub!r} (paraplan has {', '.join(subparsers())})"]
    else:
        options, names = subparsers()[c.sub]._option_string_actions, f"paraplan {c.sub}"
    problems = flag_problems(options, names, c.args)
    if c.complete and c.strict and not problems:
        argv = [c.sub, *c.args] if c.sub else list(c.args)
        problems += [p for p in strict_parse_problems(argv) if not (c.inline and is_reference(p, c))]
    return problems


def is_reference(problem: str, c: Command) -> bool:
    """Prose names a command (`paraplan train`, `paraplan plan --engine`) without what a run needs."""
    return ("the following arguments are required" in problem
            or (bool(c.args) and f"argument {c.args[-1]}: expected one argument" in problem))


def strict_parse_problems(argv: list[str]) -> list[str]:
    from paraplan.errors import ParaplanError

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version: 0
        if exc.code not in (0, None):
            return [f"parse_args exits {exc.code}: {err.getvalue().strip()}"]
    except ParaplanError as exc:  # cli.args.Parser's usage error
        return [f"parse_args refuses it: {exc}"]
    return []


def prose_problems(p: ProseFlag) -> list[str]:
    words = tuple(tokens(p.text) or ())
    if any(w.partition("=")[0] in FOREIGN or w.startswith(FOREIGN_PREFIXES) for w in words):
        return []  # another program's command line (`--module llama3 --config ...`: torchtitan's)
    own = [w for w in words if w.startswith("--")]
    candidates = sorted(p.named & subparsers().keys()) or list(subparsers())
    flags = {w.partition("=")[0] for w in own}
    having = [s for s in candidates if flags <= subparsers()[s]._option_string_actions.keys()]
    if not having:
        where = (f"the sentence's {', '.join(candidates)}" if p.named else "any subcommand")
        missing = sorted(f for f in flags if not any(f in subparsers()[s]._option_string_actions for s in candidates))
        return [f"{', '.join(missing) or ' '.join(sorted(flags)) + ' together'}: not an option of {where}"]
    # the values, against the first subcommand that has every flag
    problems = []
    for s in having:
        problems = flag_problems(subparsers()[s]._option_string_actions, f"paraplan {s}", words)
        if not problems:
            return []
    return problems


def report(items, check) -> list[str]:
    return [f"{item.where}: `{item.text}`: {problem}" for item in items for problem in check(item)]


def test_the_docs_name_commands_and_flags():
    commands, prose = docs()
    assert len(commands) >= 100 and len(prose) >= 100, (len(commands), len(prose))
    assert sum(c.complete and c.strict for c in commands) >= 40
    named = {c.sub for c in commands}
    assert set(subparsers()) <= named, f"no doc names {set(subparsers()) - named}"
    # the forms the reader must find: a continued line, a torchrun line, a line inside bash -c, a table row
    wheres = {c.where for c in commands}
    assert {"docs/auto.md:4", "docs/runtime.md:7", "docs/guide/torchrun.md:65", "README.md:48"} <= wheres


def test_every_documented_command_names_a_subcommand_and_its_flags():
    problems = report(docs()[0], command_problems)
    assert not problems, "\n".join(["documented commands the command line refuses:", *problems])


def test_every_flag_named_in_prose_exists():
    problems = report(docs()[1], prose_problems)
    assert not problems, "\n".join(["flags named in the docs' prose that no such subcommand has:", *problems])


# --- the reader itself, on text written to fail ---------------------------------------------------------

BAD_DOC = """\
Plan it:

```console
$ paraplan plan --model gpt2-tiny --cluster local --batch 8 --knobs context_parallel=2
$ paraplan plan --model gpt2-tiny --cluster local --batch 8 --schedule sideways
$ paraplan planx --model gpt2-tiny
$ paraplan simulate plan.json --gantt g.png --memory-budget 16GiB
plan written to plan.json (paraplan plan's output, not a command)
```

```
paraplan train --plan plan.json \\
               [--steps S] [--frobnicate]
paraplan train --plan "plan.json
```

Then `paraplan simulate plan.json --schedules zbv,fast` and `train --comapre`. `--prove` is
`plan`'s, and so is `--schedule best`. `paraplan train` has no `--prove`. Nor `--schedule later`.
"""


def test_the_reader_finds_what_is_wrong(tmp_path, monkeypatch):
    doc = tmp_path / "README.md"
    doc.write_text(BAD_DOC)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "doc_files", lambda: [doc])
    commands, prose = read_docs()
    found = report(commands, command_problems) + report(prose, prose_problems)
    expected = [
        "README.md:4: `paraplan plan --model gpt2-tiny --cluster local --batch 8 --knobs context_parallel=2`: "
        "--knobs: not an option of paraplan plan",
        "README.md:5: ", "--schedule sideways: expected one of",
        "README.md:6: ", "no subcommand 'planx'",
        "README.md:7: ", "--memory-budget: not an option of paraplan simulate",
        "README.md:12: ", "--frobnicate: not an option of paraplan train",
        "README.md:17: `paraplan simulate plan.json --schedules zbv,fast`: --schedules zbv,fast: unknown schedule 'fast'",
        "README.md:17: `train --comapre`: --comapre: not an option of paraplan train",
        "README.md:18: `--prove`: --prove: not an option of the sentence's train",
        "README.md:18: `--schedule later`: --schedule later: expected one of",
    ]
    text = "\n".join(found)
    for part in expected:
        assert part in text, f"{part!r} not reported in:\n{text}"
    assert "README.md:14: `paraplan train --plan \"plan.json`: unbalanced quotes" in text
    assert len(found) == 10, text
    assert not any("README.md:8" in line for line in found)  # output, not a command



def test_the_documented_node_range_is_the_codes():
    """`NAME?nodes=N` takes 1 to MAX_PRESET_NODES nodes: docs/clusters.md and the presets' comments
    say that number (they said 384 while the code took 4,096)."""
    from paraplan.hardware.presets import MAX_PRESET_NODES

    presets = sorted((ROOT / "src" / "paraplan" / "hardware" / "presets").glob("*.toml"))
    said = []
    for path in [*doc_files(), *presets]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"\b1 ?(?:to|-) ?(\d[\d,]*) nodes|nodes=N` for 1 ?(?:to|-) ?(\d[\d,]*)", line):
                said.append((f"{path.relative_to(ROOT)}:{n}", int((m.group(1) or m.group(2)).replace(",", ""))))
    assert len(said) >= 5, said  # clusters.md's two DGX rows and its sentence, the two DGX presets' comments
    wrong = [f"{where}: 1 to {value} nodes" for where, value in said if value != MAX_PRESET_NODES]
    assert not wrong, f"the code takes 1 to {MAX_PRESET_NODES} nodes (hardware/presets.py):\n" + "\n".join(wrong)
