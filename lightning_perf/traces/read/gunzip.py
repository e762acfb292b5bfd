"""Opening gzip trace files for reading: ISA-L's decompressor (the ``isal`` package) where it is installed, else
the standard library's zlib.

torch writes every trace gzip'd, so inflating is a fixed part of reading one: on the 2-core machine, Python's
``gzip`` streamed 29-33 MB DDP traces in 25.5-28.6 ms, ``isal.igzip`` in 6.5-8.3 ms, the same bytes (see
benchmarks/README.md). ``isal`` is a dependency on the platforms it ships wheels for; elsewhere nothing changes
but the speed.

Standard library and, when present, isal; imports nothing from torch or Lightning.
"""

from __future__ import annotations

import gzip
import zlib
from types import ModuleType
from typing import IO, BinaryIO, cast

_gzip_module: ModuleType = gzip
_isal_error: type[BaseException] = zlib.error
try:
    from isal import igzip, isal_zlib

    _gzip_module = igzip
    _isal_error = cast(type[BaseException], isal_zlib.error)  # isal's stub types the class as an instance
except ImportError:  # no wheel for this platform: zlib's gzip, the same results more slowly
    pass

# What reading a gzip stream raises on corrupt or truncated data, whichever decompressor reads it.
GZIP_ERRORS: tuple[type[BaseException], ...] = (gzip.BadGzipFile, EOFError, zlib.error, _isal_error)
FAST_GUNZIP = _gzip_module is not gzip


def open_gzip_text(path: str, errors: str = "strict") -> IO[str]:
    """``path`` (gzip) as UTF-8 text, newlines as written."""
    return _gzip_module.open(path, "rt", encoding="utf-8", errors=errors, newline="")


def open_gzip(path: str) -> BinaryIO:
    """``path`` (gzip) as bytes, with the same decompressor as :func:`open_gzip_text`."""
    return _gzip_module.open(path, "rb")
