"""What the tab has read, kept while the file is unchanged: a summary is decoded once (its typed decoding costs
~0.1 s), a trace analysed once, however often the page asks."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# Results kept: a summary is a few KiB, a trace's analysis a few hundred.
CACHE_SIZE = 256


def stamp(path: str) -> tuple[str, int, int]:
    """What tells a changed file from the one read: its path, size and modification time."""
    info = os.stat(path)
    return (os.path.realpath(path), info.st_size, info.st_mtime_ns)


class Cache:
    """Results by key, least recently used dropped first. Two requests for one key may both compute it (the
    page asks a pane once a click); the lock guards the dict only, never a computation."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


cached = Cache()
