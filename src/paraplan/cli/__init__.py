"""The `paraplan` command: parsing, calling the library, printing. No logic of its own.

One module per command, each adding its own subparser (`add_parser`) and running it (`run`):
listing (models, clusters), inspect, plan (one planner, or every one compared), simulate, train, export,
profile (and profile-links), bench, calibrate. args.py holds the argument types and the checks that
run before any work, ui.py the progress bars, spinners and SIGTERM. The requests themselves are
built by the library (paraplan/workload.py), as the Python API builds them.

Bad input ends with one line on stderr and exit status 2 (ParaplanError); anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys

from paraplan.cli import bench, calibrate, export, inspect, listing, plan, profile, simulate, train
from paraplan.cli.args import FLAGS, SEE_NAMES, Parser
from paraplan.cli.ui import Terminated, on_sigterm
from paraplan.errors import FieldError, ParaplanError, UnknownNameError
from paraplan.version import __version__

# each command's subparser, in the order `paraplan --help` lists them
SUBPARSERS = (listing.add_models, listing.add_clusters, inspect.add_parser, plan.add_parser, simulate.add_parser,
              train.add_parser, export.add_parser, profile.add_profile, bench.add_parser, profile.add_profile_links,
              calibrate.add_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="paraplan", description="Plan, predict and run distributed training of PyTorch models.")
    parser.add_argument("--version", action="version", version=f"paraplan {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND",
                                help="what to do (`paraplan COMMAND --help` for its options)")
    for add in SUBPARSERS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:  # bare `paraplan`: what it can do
            parser.print_help()
            return 0
        from paraplan.simulator.limits import set_memory_source
        from paraplan.system.host import available_memory_bytes

        set_memory_source(available_memory_bytes)  # the simulator refuses graphs beyond the free memory
        return args.func(args)
    except UnknownNameError as exc:  # close matches only; with none, where to see the names
        where = SEE_NAMES.get(exc.kind)
        print(f"paraplan: error: {exc}" + (f"; see `{where}`" if where and not exc.close else ""), file=sys.stderr)
        return 2
    except FieldError as exc:
        flag = FLAGS.get(exc.field, exc.field)
        print(f"paraplan: error: {flag}: {exc.detail}", file=sys.stderr)
        return 2
    except ParaplanError as exc:
        print(f"paraplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("paraplan: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("paraplan: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:
        return 0


def run() -> None:
    """The `paraplan` executable (and `python -m paraplan`): `main`, then out without tearing the
    interpreter down module by module (a second of the command's wall time once torch and
    transformers are loaded: 1.1 s of `paraplan plan` at 1,024 GPUs). The exit handlers still run
    and the streams are flushed; where another thread is alive, the ordinary exit waits for it."""
    import atexit
    import os
    import threading

    code = main()
    if threading.active_count() > 1:
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to say
            pass
    os._exit(code if isinstance(code, int) else 1)
