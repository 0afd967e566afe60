"""`local` means this machine as measured (issue 33): the commands that predict times on `local`
(plan, simulate, train --compare, --prove) use the cached calibration of this machine, making it
once with `paraplan calibrate --quick` and saying so in one line; `--no-calibration` keeps the
analytic preset; `--profile`, `--overheads` or a cluster file override the cache."""

from __future__ import annotations

import sys

NO_CALIBRATION_HELP = ("with --cluster local: the analytic preset, not this machine's calibration (made once by "
                       "`paraplan calibrate --quick` and cached; `paraplan calibrate` redoes it)")


def add_calibration_flag(parser) -> None:
    parser.add_argument("--no-calibration", action="store_true", help=NO_CALIBRATION_HELP)


def machine_cluster(name: str | None, precision: str | None, *, skip: bool = False, make: bool = True,
                    check=lambda: None) -> str | None:
    """`name` itself, or for `local` (unless `skip`) the path of this machine's calibration in
    `precision`, measured now if there is none (one line before, one after, on stderr); with `make`
    False only a cached one (`local` itself without). `check()` runs before a measurement starts:
    what can refuse the request in one line (the model, built on meta) does so before the user waits
    a minute for this machine to be measured."""
    from paraplan.errors import ParaplanError
    from paraplan.profiling.calibration_cache import local_cluster

    refused: list[ParaplanError] = []  # the request's own refusal, not the calibration's

    def on_start(path) -> None:
        try:
            check()
        except ParaplanError as exc:
            refused.append(exc)
            raise
        what = ("this machine once (paraplan calibrate --quick, about a minute)" if path.name.endswith("-fp32.toml")
                else f"this machine's {path.stem.rsplit('-', 1)[-1]} compute once (its layers under autocast, "
                     "about 20 s)")
        print(f"paraplan: measuring {what}: it is kept in {path}", file=sys.stderr, flush=True)

    def on_made(found) -> None:
        print(f"paraplan: this machine measured in {found.seconds:.0f} s; `paraplan calibrate` redoes it, "
              "--no-calibration plans on the analytic preset", file=sys.stderr, flush=True)

    try:
        return local_cluster(name, precision, skip=skip, make=make, on_start=on_start, on_made=on_made)
    except ParaplanError as exc:  # the library names no flag; the command line's way out is this one
        if refused:
            raise
        raise ParaplanError(f"{exc} (--no-calibration)") from None


def costs_line(source: str) -> str:
    """What a printed prediction stands on, in one line (issue 33)."""
    if source.startswith("analytic preset local"):
        return (f"costs: {source}: absolute times are estimates until `paraplan calibrate` measures it (or drop "
                "--no-calibration); trust the rankings")
    if source.startswith("analytic preset"):
        return (f"costs: {source} (published figures, not a machine paraplan measured): absolute times are "
                "estimates; trust the rankings")
    return f"costs: {source}"
