"""`paraplan plan --option NAME=VALUE` (repeatable; `--options` too): any option a planner declares
(planners/table.py: `register(..., options={name: OptionSpec(...)})`), its value read as the type
of the option's default, and checked with the planner's own checks before any work. The per-planner
flags (--eta, --method, --mode, --seed, --runnable) are the same options under names of their own."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from paraplan.errors import FieldError, ParaplanError

OPTION_HELP = ("a planner's option as NAME=VALUE, e.g. context_parallel=2 (galvatron-bmw); repeatable. The value is "
               "read as the type of the option's default (a whole number, a number, true / false, or text); a "
               "planner refuses an option it does not have, naming the ones it has")


def option_pair(text: str) -> tuple[str, str]:
    """The argparse type of --option: NAME=VALUE as (NAME, VALUE), refused in one line without `=`."""
    name, eq, value = text.partition("=")
    if not eq or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. context_parallel=2), got {text!r}")
    return name.strip(), value.strip()


def add_option_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--option", "--options", dest="option", action="append", type=option_pair, default=None,
                        metavar="NAME=VALUE", help=OPTION_HELP)


def typed(name: str, text: str, default) -> object:
    """`text` as the type of the option's default: bool (true / false), int, float, or the text."""
    if isinstance(default, bool):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ParaplanError(f"--option {name}: expected true or false, got {text!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ParaplanError(f"--option {name}: expected a whole number, got {text!r}") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise ParaplanError(f"--option {name}: expected a number, got {text!r}") from None
    return text


def options_given(planner: str, pairs, flags: Mapping[str, object], specs: Mapping) -> dict:
    """The options of `--option NAME=VALUE` pairs for `planner` (whose options are `specs`), typed;
    `flags`: the options the per-planner flags gave (name -> value or None), which an --option may
    not give again. A name the planner does not declare is refused in one line."""
    out: dict[str, object] = {}
    for name, text in pairs or ():
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise ParaplanError(f"--option {name}: planner {planner!r} has no such option (its options: {known})")
        if name in out:
            raise ParaplanError(f"--option {name}: given twice")
        if flags.get(name) is not None:
            flag = "--batch" if name == "batch_search" else f"--{name}"
            raise ParaplanError(f"--option {name}: given by {flag} too; give it once")
        out[name] = typed(name, text, specs[name].default)
    return out


def checked(planner: str, options: Mapping[str, object], specs: Mapping, from_pairs) -> None:
    """The planner's own checks of every value (planners/request.py: validated_options); a value an
    --option gave is refused under that flag's name."""
    from paraplan.planners.request import validated_options

    try:
        validated_options(planner, options, specs)
    except FieldError as exc:
        name = exc.field.removeprefix("options.")
        if name in from_pairs:
            raise ParaplanError(f"--option {name}: {exc.detail}") from None
        raise
