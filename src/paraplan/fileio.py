"""Writing files so that nothing half-written is ever left behind (every writer uses this), and
reading JSON documents with one-line errors."""

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


def read_json(path: str | Path, what: str, error: type[Exception]):
    """The JSON document at `path`, or `error` with one line naming the file and what went wrong."""
    import json

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: malformed JSON: {exc}") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def _umask() -> int:
    """The process's umask (reading it means setting it; set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def output_problem(path: str | Path, *, directory: bool = False) -> str | None:
    """Why `path` cannot be written, or None: checked before any work, so that a run never ends in
    a traceback after minutes of measuring, planning or training. A file needs an existing,
    writable parent directory and must not be a directory itself; a directory (`directory=True`)
    may not exist yet, but then its nearest existing ancestor must be a writable directory."""
    path = Path(path)
    if directory:
        if path.exists():
            if not path.is_dir():
                return f"{path} exists and is not a directory"
            return None if os.access(path, os.W_OK | os.X_OK) else f"directory {path} is not writable"
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"cannot create {path}: {ancestor} is not a directory"
        if not os.access(ancestor, os.W_OK | os.X_OK):
            return f"cannot create {path}: directory {ancestor} is not writable"
        return None
    if path.is_dir():
        return f"{path} is a directory"
    parent = path.parent
    if not parent.exists():
        return f"directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable"
    return None


def make_dirs(path: str | Path) -> list[Path]:
    """mkdir -p, returning the directories it created (outermost first) so that a run that is
    refused or fails before writing anything can remove them again (remove_if_empty)."""
    path = Path(path)
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    created = []
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        created.append(d)
    return created


def remove_if_empty(created: list[Path]) -> None:
    """Remove directories made by make_dirs that are still empty, innermost first."""
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return  # not empty (or gone): its parents are not empty either
