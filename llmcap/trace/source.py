"""Where a trace's bytes come from. Readers memory-map and re-read files, so a stream — a pipe such as
`<(zcat trace.jsonl.gz)` — or a compressed file (.gz, .bz2, .xz, .zst) is first copied, decompressed,
to a temporary file that lives as long as the read; a regular file is read in place.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import lzma
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from llmcap.errors import InputFileError


def _zstd(path: Path) -> io.BufferedIOBase:
    return pa.CompressedInputStream(
        pa.OSFile(str(path)), "zstd"
    )  # a pyarrow NativeFile: file-like (read, context manager)


#: Compressed containers by file suffix, and how to open each for reading (the caller closes what they open).
DECOMPRESSORS: dict[str, Callable[[Path], io.BufferedIOBase]] = {
    ".gz": lambda p: gzip.open(p, "rb"),  # noqa: SIM115
    ".bz2": lambda p: bz2.open(p, "rb"),  # noqa: SIM115
    ".xz": lambda p: lzma.open(p, "rb"),  # noqa: SIM115
    ".zst": _zstd,
    ".zstd": _zstd,
}


def require_file(path: Path) -> None:
    """A path that can be opened as a trace, or one error saying why not (a symlink loop is not a missing file)."""
    if not path.exists():
        if path.is_symlink():
            try:
                path.resolve(strict=True)
            except RuntimeError:  # Python < 3.13 reports a loop as RuntimeError
                raise InputFileError(path, "symbolic link loop (the link points back to itself)") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InputFileError(path, "symbolic link loop (the link points back to itself)") from None
            raise InputFileError(path, f"broken symbolic link (to {os.readlink(path)}, which does not exist)")
        raise InputFileError(path, "file not found")
    if path.is_dir():
        raise InputFileError(path, "is a directory, expected a trace file")


@contextmanager
def local_file(path: Path) -> Iterator[Path]:
    """A regular, uncompressed file holding `path`'s trace: `path` itself, or a temporary copy."""
    require_file(path)
    opener = DECOMPRESSORS.get(path.suffix.lower())
    regular = stat.S_ISREG(path.stat().st_mode)
    if opener is None and regular:
        yield path
        return
    name = path.stem if opener is not None else path.name
    with tempfile.TemporaryDirectory(prefix="llmcap-trace-") as tmp:
        local = Path(tmp) / (name or "trace")
        try:
            with opener(path) if opener is not None else path.open("rb") as src, local.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, EOFError, zlib.error, lzma.LZMAError, pa.ArrowInvalid) as exc:
            raise InputFileError(
                path, f"cannot read{' compressed' if opener else ''} input ({str(exc).splitlines()[0]})"
            ) from None
        yield local
