"""The forkserver's heap set aside before it forks anything (the last of WARM_MODULES).

The server imports torch, torch.distributed and transformers (system/processes.py), some 10^6
objects that every child inherits. Each full collection in a child scanned all of them: a rank's
teardown collects twice (runtime/launcher/teardown.py), ~0.2 s each, and every scan writes the
objects' GC headers, copying their pages into the child. `gc.freeze()` in the server moves what it
holds into the permanent generation, which no child's collection scans (CPython's documented use:
"freeze before fork"). What the teardown must still find among them, torch.distributed's memos
(functools.lru_cache wrappers, found by type), is listed here once, in the server, rather than by
walking the whole heap in each rank.

Imported anywhere but inside a forkserver's preload (a test that imports every module, a process
that reads WARM_MODULES), it does nothing.
"""

from __future__ import annotations

import atexit
import functools
import gc
import sys

# torch.distributed's lru_cache wrappers that existed when the server froze its heap
INHERITED_MEMOS: list = []


def _in_forkserver_preload() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(("multiprocessing/forkserver.py",
                                                                 "multiprocessing\\forkserver.py")):
            return True
        frame = frame.f_back
    return False


def distributed_memos(objects) -> list:
    return [obj for obj in objects if type(obj) is functools._lru_cache_wrapper
            and str(getattr(obj, "__module__", "")).startswith("torch.distributed")]


if _in_forkserver_preload():
    gc.collect()  # nothing collectable frozen for ever
    INHERITED_MEMOS.extend(distributed_memos(gc.get_objects()))
    gc.freeze()
    # the server's own exit collects its heap as before: a frozen extension object is never freed,
    # and nanobind (triton's bindings, which torch imports) then prints "leaked N instances" on the
    # launcher's stderr. Its children leave by os._exit and never run this.
    atexit.register(gc.unfreeze)
