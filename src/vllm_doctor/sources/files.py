"""Opening a saved log: what the bytes on disk are, before any line is read.

A log reaches the doctor as plain UTF-8 most of the time, but also gzip/bzip2/xz-compressed (rotated
logs: `server.log.1.gz`), as UTF-16 (PowerShell's `>` writes UTF-16 LE with a BOM), or as something
that is no log at all. Reading any of those as UTF-8 text finds no line a rule knows and reports "no
problem found": a false all-clear. So a compressed log is read through its decompressor, a UTF-16/32 log
is re-encoded to UTF-8, and what cannot be read as text is refused in one line.
"""
from __future__ import annotations

import bz2
import codecs
import io
import lzma
import zlib
from typing import BinaryIO

SNIFF_BYTES = 64 << 10
TEXT_CHUNK = 1 << 20            # characters per read of a re-encoded (UTF-16/32) log
RAW_READ = 1 << 20              # compressed bytes per read

_COMPRESSED = {b"\x1f\x8b": ("gzip", lambda: zlib.decompressobj(wbits=31)), b"BZh": ("bzip2", bz2.BZ2Decompressor),
               b"\xfd7zXZ\x00": ("xz", lzma.LZMADecompressor)}
_REFUSED = {b"\x28\xb5\x2f\xfd": "a zstd-compressed file: decompress it first (`zstd -d FILE`)",
            b"PK\x03\x04": "a zip archive: unpack it and give the log inside",
            b"\x7fELF": "a program (ELF binary), not a log"}
_BOMS = [(codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")]


class LogFormatError(Exception):
    """The file is not a log the doctor can read: one line, exit 2."""


class _Converted(io.RawIOBase):
    """A byte stream produced piece by piece from another (`_more()` returns the next piece, None at the
    end), handed out in reads of any size."""

    def __init__(self, source) -> None:
        self._source = source
        self._pending = b""
        self._ended = False

    def readable(self) -> bool:
        return True

    def _more(self) -> bytes | None:
        raise NotImplementedError

    def unread(self, data: bytes) -> None:
        """Put bytes back in front (what a sniff of the first bytes took)."""
        self._pending = data + self._pending

    def read(self, size: int = -1) -> bytes:
        while not self._ended and (size < 0 or len(self._pending) < size):
            piece = self._more()
            if piece is None:
                self._ended = True
            else:
                self._pending += piece
        if size < 0:
            size = len(self._pending)
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def close(self) -> None:
        self._source.close()
        super().close()


class _Reencoded(_Converted):
    """A UTF-16/32 byte stream read back as UTF-8 bytes (what the scanner and its literals expect)."""

    def __init__(self, raw: BinaryIO, encoding: str, skip: int) -> None:
        raw.read(skip)                                     # the byte-order mark
        super().__init__(io.TextIOWrapper(raw, encoding=encoding, errors="replace", newline=""))

    def _more(self) -> bytes | None:
        chunk = self._source.read(TEXT_CHUNK)
        return chunk.encode("utf-8") if chunk else None


class _Decompressed(_Converted):
    """A compressed file read through its decompressor object, which hands out what it has so far: a file
    cut short (copied while still being written) yields everything before the cut, and `cut` says so.
    Concatenated members (`cat a.gz b.gz`) are read one after the other."""

    def __init__(self, raw: BinaryIO, new_decompressor) -> None:
        super().__init__(raw)
        self._new = new_decompressor
        self._dec = new_decompressor()
        self._produced = 0
        self.cut = False

    def _more(self) -> bytes | None:
        if self._dec.eof:                        # a member ended: another may follow
            data, self._dec = self._dec.unused_data, self._new()
            data = data or self._source.read(RAW_READ)
            if not data:
                return None
        else:
            data = self._source.read(RAW_READ)
            if not data:                         # the file ends inside a member
                self.cut = True
                return None
        try:
            out = self._dec.decompress(data)
        except (OSError, ValueError, EOFError, zlib.error, lzma.LZMAError) as exc:
            if not self._produced:
                raise OSError(f"corrupt compressed data ({exc})") from None
            self.cut = True                      # garbage after good data: keep what was read
            return None
        self._produced += len(out)
        return out


def sniff(head: bytes) -> tuple[str, str | None]:
    """(kind, detail) of a file from its first bytes: ("compressed", name), ("encoded", codec),
    ("refused", why), ("text", None)."""
    for magic, (name, _) in _COMPRESSED.items():
        if head.startswith(magic):
            return "compressed", name
    for magic, why in _REFUSED.items():
        if head.startswith(magic):
            return "refused", why
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return "encoded", codec
    sample = head[:4096]
    if len(sample) >= 64:
        # UTF-16 without a BOM: ASCII text leaves every other byte NUL
        even, odd = sample[0::2].count(0), sample[1::2].count(0)
        half = len(sample) // 2
        if odd > 0.4 * half and even < 0.05 * half:
            return "encoded", "utf-16-le"
        if even > 0.4 * half and odd < 0.05 * half:
            return "encoded", "utf-16-be"
    if head:
        text = head.decode("utf-8", errors="replace")
        bad = text.count("\ufffd") + text.count("\x00")
        if bad > 0.3 * len(text):
            return "refused", "binary data, not a text log"
    return "text", None


def _spooled(raw: BinaryIO) -> BinaryIO:
    """A stream that cannot seek, copied to its end into an unnamed temporary file (sniffing its first bytes
    needs to go back to them, and a saved log is read whole anyway)."""
    import shutil
    import tempfile

    spool = tempfile.TemporaryFile(prefix="vllm-doctor-log-")
    try:
        with raw:
            shutil.copyfileobj(raw, spool, 1 << 20)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool


def open_log(path: str) -> tuple[BinaryIO, str | None]:
    """The log's bytes as UTF-8 text, and a note on how it was read (None for a plain log). Raises
    LogFormatError for what is no readable log, OSError as open() does."""
    raw = open(path, "rb")
    if not raw.seekable():                  # a FIFO: `vllm-doctor <(kubectl logs pod)`, `/dev/stdin`
        raw = _spooled(raw)
    try:
        head = raw.read(SNIFF_BYTES)
        raw.seek(0)
        kind, detail = sniff(head)
        if kind == "text":
            return raw, None
        if kind == "refused":
            raise LogFormatError(f"{path} is {detail}")
        if kind == "encoded":
            skip = next((len(bom) for bom, codec in _BOMS if codec == detail and head.startswith(bom)), 0)
            return _Reencoded(raw, detail, skip), f"read as {detail.upper()}"
        new = next(d for magic, (name, d) in _COMPRESSED.items() if name == detail)
        stream = _Decompressed(raw, new)
        inner = stream.read(SNIFF_BYTES)
        if sniff(inner)[0] != "text":
            raise LogFormatError(f"{path} is {detail}-compressed, but what it holds is not a UTF-8 text log: "
                                 "decompress it and look at what it is")
        stream.unread(inner)
        return stream, f"{detail}-compressed"
    except BaseException:
        raw.close()
        raise
