"""A followed path, the way `tail -F` sees it: the open file, its identity, how far it was read."""
from __future__ import annotations

import os

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

    def open(self) -> bool:
        try:
            f = open(self.path, "rb")
        except OSError:
            return False
        try:
            st = os.fstat(f.fileno())
        except OSError:
            f.close()
            return False
        if os.path.isdir(self.path):
            f.close()
            raise IsADirectoryError(self.path)
        self.close()
        self.file, self.ident, self.pos = f, (st.st_dev, st.st_ino), 0
        self.generation += 1
        return True

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None

    def read(self, limit: int = READ_BUDGET) -> bytes:
        if self.file is None:
            return b""
        try:
            data = self.file.read(min(BLOCK, limit))
        except OSError:
            return b""
        self.pos += len(data)
        return data or b""

    def truncated(self) -> bool:
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
