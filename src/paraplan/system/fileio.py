"""Writing files so that nothing half-written is ever left behind (every writer uses this), and
reading JSON documents with one-line errors.

A write goes to a temporary file beside its target, is flushed to the disk, and is renamed over
the target only once complete: a write that fails leaves the old file (or none) and no temporary.
The rename replaces whatever the target is, so a target that exists and is not a regular file (a
character or block device, a FIFO, a socket, a symbolic link) is refused, never written through:
as root, `--out /dev/full` used to turn the device node into a regular file, and writing through
a link or into a FIFO cannot be atomic. A full disk (ENOSPC, or a quota: EDQUOT) is one line,
"no space left on device: PATH", however deep the write that met it (a rank's checkpoint too).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from paraplan.errors import ParaplanError

# in the name of every temporary, so that those of a process killed while writing (a rank stopped
# by the launcher) can be found and removed (remove_temporaries)
TEMP_MARK = ".paraplan-tmp."
_FULL = (errno.ENOSPC, errno.EDQUOT)
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class WriteError(ParaplanError):
    """A write refused or failed for a reason a person can fix (a full disk, a target that is not a
    regular file): one line, exit status 2."""


def not_regular(path: str | Path) -> str | None:
    """Why the thing at `path` must not be replaced by a write (it exists and is not a regular
    file), or None (a regular file, or nothing there). lstat: a symbolic link is refused as a link,
    whatever it points to."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or not reachable): the write itself says what is wrong
        return None
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"{path} is not a regular file ({kind}): refusing to replace it"


def no_space(exc: BaseException | None) -> bool:
    """Whether a full disk (or quota) is behind `exc`, directly or as its cause or context."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def atomic_write(path: str | Path, write: Callable[[str], None], *, durable: bool = True) -> None:
    """Call write(tmp_path) on a temporary file beside `path`, then rename it into place.
    `durable`: the data reach the disk (fsync) before the rename, so that a crash cannot leave a
    renamed but empty file, and a full disk that the page cache hid is met before the old file is
    replaced; off only for a file rewritten several times a second (the losses during a run).
    Raises WriteError for a target that is not a regular file (before writing anything, and again
    just before the rename) and for a full disk."""
    path = Path(path)
    _refuse_not_regular(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}{TEMP_MARK}", suffix=path.suffix)
    except OSError as exc:  # no inode left is a full disk too
        if no_space(exc):
            raise WriteError(f"no space left on device: {path}") from None
        # e.g. under /proc or a read-only mount, which the checks before the work cannot all foresee
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        write(tmp)
        if durable:
            _fsync(tmp)
        # mkstemp makes the file 0600; the written file gets what open() would give it (the umask)
        os.chmod(tmp, 0o666 & ~_umask())
        _refuse_not_regular(path)  # something may have appeared there while we wrote
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if no_space(exc):
            raise WriteError(f"no space left on device: {path}") from None
        if isinstance(exc, OSError) and not isinstance(exc, ParaplanError):
            # the file that failed, where it is not ours (a font the figure could not read)
            other = exc.filename if exc.filename not in (None, tmp, str(path)) else None
            raise WriteError(f"cannot write {path}: {exc.strerror or exc}"
                             + (f" ({other})" if other else "")) from None
        raise
    if durable:
        _fsync(path.parent)  # the rename itself


def atomic_write_stream(path: str | Path, write: Callable[[BinaryIO], None], *, durable: bool = True) -> tuple[str, int]:
    """atomic_write for a writer that takes a binary file object; returns the sha256 (hex) and the
    size of the bytes written (checkpoints record them), hashed as they pass, not read back."""
    written: list[tuple[str, int]] = []

    def to_temp(tmp: str) -> None:
        with _open_temp(tmp) as raw:
            f = _Recording(raw)
            try:
                write(f)
            except BaseException as exc:
                # torch.save reports a failed write as RuntimeError("... unexpected pos ..."): the
                # OSError behind it (a full disk) is what a person needs to see
                if f.error is not None and f.error is not exc:
                    raise f.error from exc
                raise
        written.append((f.sha256.hexdigest(), f.size))

    atomic_write(path, to_temp, durable=durable)
    return written[0]


def atomic_write_text(path: str | Path, text: str, *, durable: bool = True) -> None:
    atomic_write_stream(path, lambda f: f.write(text.encode("utf-8")), durable=durable)


def atomic_torch_save(obj, path: str | Path) -> tuple[str, int]:
    """torch.save(obj, path), atomically; returns (sha256 hex, bytes) of the file written."""
    import torch

    return atomic_write_stream(path, lambda f: torch.save(obj, f))


def _open_temp(tmp: str) -> BinaryIO:
    """Every byte of atomic_write_stream goes through the file this returns (the tests put a full
    disk here)."""
    return open(tmp, "wb")


class _Recording:
    """A write-only view of a binary file that hashes and counts what passes through it and keeps
    the OSError a write met (torch.save replaces it by a RuntimeError of its own)."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.sha256, self.size, self.error = raw, hashlib.sha256(), 0, None

    def write(self, data) -> int:
        try:
            n = self.raw.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.sha256.update(data)
        self.size += len(memoryview(data).cast("B"))
        return n

    def flush(self) -> None:
        try:
            self.raw.flush()
        except OSError as exc:
            self.error = exc
            raise


def _refuse_not_regular(path: Path) -> None:
    problem = not_regular(path)
    if problem:
        raise WriteError(problem)


def _fsync(path: str | Path) -> None:
    """fsync a file (or a directory: the entries renamed into it). A file system that cannot sync a
    directory (EINVAL) is no error; a full disk met here is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def remove_temporaries(directory: str | Path) -> None:
    """Remove the temporaries of atomic writes that a killed process left in `directory` (the
    launcher calls it once every rank of a failed run is stopped)."""
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return
    for entry in entries:
        if TEMP_MARK in entry.name and entry.name.startswith(".") and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)


def read_text(path: str | Path, what: str, error: type[Exception]) -> str:
    """The UTF-8 text at `path` (plan JSON, cluster TOML), or `error` with one line naming the file
    and what went wrong."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a text (UTF-8) file: byte {exc.start} is {exc.object[exc.start]:#04x}") from None


def read_json(path: str | Path, what: str, error: type[Exception]):
    """The JSON document at `path`, or `error` with one line naming the file and what went wrong."""
    import json

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: malformed JSON: {exc}") from None


def _umask() -> int:
    """The process's umask (reading it means setting it; set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def output_problem(path: str | Path, *, directory: bool = False, files: Iterable[str] = ()) -> str | None:
    """Why `path` cannot be written, or None: checked before any work, so that a run never ends in
    a traceback after minutes of measuring, planning or training. A file needs an existing,
    writable parent directory and must not be a directory, nor anything else that is not a regular
    file (a device, a FIFO, a link: writes refuse to replace those, atomic_write); a directory
    (`directory=True`) may not exist yet, but then its nearest existing ancestor must be a writable
    directory; if it exists, the entries in it that match the glob patterns `files` (what the run
    will write there) must be regular files."""
    path = Path(path)
    if directory:
        if path.exists():
            if not path.is_dir():
                return f"{path} exists and is not a directory"
            if not os.access(path, os.W_OK | os.X_OK):
                return f"directory {path} is not writable"
            return _entries_problem(path, tuple(files))
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"cannot create {path}: {ancestor} is not a directory"
        if not os.access(ancestor, os.W_OK | os.X_OK):
            return f"cannot create {path}: directory {ancestor} is not writable"
        try:  # permissions are not the whole story (/proc, a read-only mount): make one and remove it
            os.rmdir(tempfile.mkdtemp(prefix=".paraplan-probe-", dir=ancestor))
        except OSError as exc:
            return f"cannot create {path}: {exc.strerror or exc}"
        return None
    if path.is_dir() and not path.is_symlink():
        return f"{path} is a directory"
    problem = not_regular(path)
    if problem:
        return problem
    parent = path.parent
    if not parent.exists():
        return f"directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable"
    return None


def _entries_problem(directory: Path, patterns: tuple[str, ...]) -> str | None:
    if not patterns:
        return None
    try:
        entries = sorted(directory.iterdir())
    except OSError:  # unreadable: the run's own writes will say what is wrong
        return None
    for entry in entries:
        if any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
            problem = not_regular(entry)
            if problem:
                return problem
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
        try:
            d.mkdir(exist_ok=True)
        except OSError as exc:  # e.g. under /proc, which a permission check of the parent passes
            remove_if_empty(created)
            raise WriteError(f"cannot create the directory {d}: {exc.strerror or exc}") from None
        created.append(d)
    return created


def make_dirs_all(*paths: str | Path | None) -> list[list[Path]]:
    """make_dirs of each path given (None skipped), all or none: when one fails, what the earlier
    ones made is removed again. One list of created directories per path, for remove_if_empty."""
    created: list[list[Path]] = []
    for path in paths:
        if path is None:
            continue
        try:
            created.append(make_dirs(path))
        except ParaplanError:
            for dirs in created:
                remove_if_empty(dirs)
            raise
    return created


def remove_if_empty(created: list[Path]) -> None:
    """Remove directories made by make_dirs that are still empty, innermost first."""
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return  # not empty (or gone): its parents are not empty either


def is_finite_number(value: object) -> bool:
    """A number a file may give where a float is read: not a bool, finite, and within a float's range
    (TOML and JSON integers have no bound: 10**400 is a valid integer that overflows a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
