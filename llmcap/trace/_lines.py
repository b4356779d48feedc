"""Line positions of a text file, found with one vectorised scan (the file is memory-mapped).

Used to name the exact line of a bad record and to keep the raw text of quarantined rows; the
happy path never touches Python per line.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

UTF8_BOM = b"\xef\xbb\xbf"


class LineIndex:
    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        self._data = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, dtype=np.uint8)

    @cached_property
    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        data = self._data
        newlines = np.flatnonzero(data == 10)
        starts = np.concatenate(([0], newlines + 1))
        ends = np.concatenate((newlines, [data.size]))
        if starts.size and starts[-1] == data.size:  # final newline: no empty last line
            starts, ends = starts[:-1], ends[:-1]
        if data.size >= 3 and bytes(data[:3]) == UTF8_BOM:
            starts[0] = 3
        crlf = (ends > starts) & (data[np.maximum(ends - 1, 0)] == 13)
        return starts, ends - crlf

    @cached_property
    def nonempty_lines(self) -> np.ndarray:
        """1-based numbers of the lines that hold something (readers skip empty lines)."""
        starts, ends = self._bounds
        return np.flatnonzero(ends > starts) + 1

    def text(self, line: int) -> str:
        starts, ends = self._bounds
        return bytes(self._data[starts[line - 1] : ends[line - 1]]).decode("utf-8", errors="replace")

    def first_open_quote_line(self) -> int | None:
        """The first line with an odd number of double quotes (a quoted field left open at its end), or None."""
        starts, ends = self._bounds
        quotes = np.flatnonzero(self._data == ord('"'))
        per_line = np.bincount(np.searchsorted(starts, quotes, side="right") - 1, minlength=starts.size)
        odd = np.flatnonzero(per_line % 2)
        return int(odd[0]) + 1 if odd.size else None
