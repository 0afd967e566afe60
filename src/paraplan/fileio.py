"""Writing files so that nothing half-written is ever left behind (every writer uses this)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call write(tmp_path) on a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes the file 0600; the written file gets what open() would give it (the umask)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def _umask() -> int:
    """The process's umask (reading it means setting it; set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
