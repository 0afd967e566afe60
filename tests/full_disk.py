"""A file on a disk that fills after `room` bytes, for the tests of writes meeting a full disk
(tests/unit/test_fileio.py in one process, tests/distributed/faults.py inside the ranks)."""

import errno
import os


class FullDisk:
    """Wraps an open binary file: the write that crosses `room` bytes raises ENOSPC (or the quota's
    EDQUOT), having written what fitted, as write(2) does."""

    def __init__(self, file, room: int, code: int = errno.ENOSPC):
        self.file, self.room, self.code = file, room, code

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.room:
            self.file.write(data[:self.room])
            self.room = 0
            raise OSError(self.code, os.strerror(self.code))
        self.room -= len(data)
        return self.file.write(data)

    def flush(self):
        self.file.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()
