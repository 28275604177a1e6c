"""A followed path, the way `tail -F` sees it: the open file, its identity, how far it was read.

A FIFO (or another stream: a character device) is opened without blocking (an open for reading waits for
a writer otherwise, deaf to signals) and read without blocking (a buffered read waits for a full block):
`stream` tells the follow loop to select on `fileno()`. A FIFO is also held open for writing, so that
its writer closing is no end of file (the pipe would read as ended, and select would report it readable
forever): the next writer's output is followed like the first's."""
from __future__ import annotations

import os
import stat

from vllm_doctor.sources.scan import BLOCK

READ_BUDGET = 64 * BLOCK        # per poll, so that signals and notices are never starved


class Tail:
    """One followed path: the open file, its identity, how far it was read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = None
        self.ident: tuple[int, int] | None = None
        self.pos = 0
        self.generation = 0
        self.stream = False             # a FIFO or device: no size, no seeking, select on fileno()
        self._fifo = False
        self._keep = -1                 # a FIFO's write end held open by us (see the module's doc)

    def open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return False
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise IsADirectoryError(self.path)
        self.close()
        self.stream, self._fifo = not stat.S_ISREG(st.st_mode), stat.S_ISFIFO(st.st_mode)
        if not self.stream:
            os.set_blocking(fd, True)
        elif self._fifo:
            self._keep = _write_end(self.path)
        self.file = os.fdopen(fd, "rb", buffering=0 if self.stream else -1)
        self.ident, self.pos = (st.st_dev, st.st_ino), 0
        self.generation += 1
        return True

    def fileno(self) -> int:
        return self.file.fileno() if self.file is not None else -1

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None
        if self._keep >= 0:
            os.close(self._keep)
            self._keep = -1

    def read(self, limit: int = READ_BUDGET) -> bytes:
        if self.file is None:
            return b""
        try:
            data = self.file.read(min(BLOCK, limit)) or b""     # None: a stream with nothing to read now
        except OSError:
            return b""
        if not data and self._fifo and self._keep < 0:
            self._reopen()
        self.pos += len(data)
        return data

    def _reopen(self) -> None:
        """A FIFO we could not hold open for writing (no permission) reads as ended once its writer
        closed, and select then reports it readable forever: open it anew, to wait for the next writer."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            st = os.fstat(fd)
        except OSError:
            return
        if (st.st_dev, st.st_ino) != self.ident:                    # the path names another file now: replaced() will tell
            os.close(fd)
            return
        self.file.close()
        self.file = os.fdopen(fd, "rb", buffering=0)

    def truncated(self) -> bool:
        if self.stream:
            return False
        try:
            return self.file is not None and os.fstat(self.file.fileno()).st_size < self.pos
        except OSError:
            return False

    def replaced(self) -> bool:
        """The path names another file now (rotation), or nothing (deleted, about to be recreated)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident


def _write_end(path: str) -> int:
    """Our own write end of a FIFO (opened while we hold its read end: it does not block), or -1."""
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return -1
