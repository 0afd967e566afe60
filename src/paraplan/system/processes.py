"""How paraplan starts the processes it runs on this machine: the ranks of a plan, the link and
load processes of `calibrate` and `profile-links`.

They start from a forkserver that imported torch, torch.distributed and transformers once per
launching process, not each importing them anew (`spawn`: 4-8 s of a core per process, most of a
short run's start, and a third of the test suite's CPU time when every process paid it). The
server has run no kernel, so no thread pool is copied into a child; cwd and sys.path are set as for
`spawn`. A child that needs the launcher's current environment gets it passed (runtime/launcher/launch.py):
a forked child otherwise sees the server's, as of its start. PARAPLAN_START_METHOD=spawn starts
each process as a fresh interpreter instead.
"""

from __future__ import annotations

import multiprocessing
import os

# what the server imports before it forks anything (one list for every caller: the first caller's
# list is the server's, and a process has one server)
# (transformers' masking, layer and generation modules: what every model family's module imports
# when a rank first builds its model, ~60 ms a rank)
WARM_MODULES = ["paraplan.runtime.kinds", "paraplan.runtime.launcher.teardown", "paraplan.models.source",
                "transformers.modeling_utils", "transformers.masking_utils", "transformers.modeling_layers",
                "transformers.generation.utils", "torch.distributed.tensor", "torch.distributed.pipelining", "torch.distributed.fsdp",
                "paraplan.system.warm_heap"]  # last: it freezes what the others imported (its docstring)


def start_method() -> str:
    """'forkserver' (the server preloading WARM_MODULES), or 'spawn' where PARAPLAN_START_METHOD
    says so; any other value is one line."""
    method = os.environ.get("PARAPLAN_START_METHOD", "forkserver")
    if method not in ("forkserver", "spawn"):
        from paraplan.errors import ParaplanError

        raise ParaplanError(f"PARAPLAN_START_METHOD: 'forkserver' or 'spawn', got {method!r}")
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(WARM_MODULES)  # no effect once this process's server runs
    return method
