"""Bounded maps for in-process caches whose keys come from traffic (tool names and versions,
tenants, conversations): a service runs for weeks, and a cache that keeps every key it ever saw
grows with the number of distinct keys, not with the load.

LruCache: past `maxsize` entries, the one used least recently goes. Thread-safe: the registry
fills some of its caches from worker threads. ExpiringCache: each entry lives `ttl_s`, at most
`maxsize` of them; for one event loop's caches."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most `maxsize` entries; `get` and `put` make an entry the most recently used."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, not {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._data))

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class ExpiringCache(Generic[K, V]):
    """Entries that live `ttl_s` after they were put, at most `maxsize` of them. Every entry
    lives as long, so the map is kept in the order its entries expire (a put moves its key to
    the end): expired ones are dropped from its front as new ones come, and past `maxsize` the
    oldest goes — it holds the keys of the last `ttl_s`, not every key it ever saw. Times are
    the caller's clock (`now`). Not thread-safe: for the caches of one event loop."""

    def __init__(self, ttl_s: float, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, not {maxsize}")
        self.ttl_s = ttl_s
        self.maxsize = maxsize
        self._data: dict[K, tuple[V, float]] = {}  # key -> (value, expires at)

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K, now: float) -> V | None:
        """The value put for `key` if it has not expired by `now`, else None."""
        entry = self._data.get(key)
        return entry[0] if entry is not None and entry[1] > now else None

    def put(self, key: K, value: V, now: float) -> None:
        data = self._data
        data.pop(key, None)
        data[key] = (value, now + self.ttl_s)
        while data:
            oldest = next(iter(data))
            if len(data) <= self.maxsize and data[oldest][1] > now:
                break
            del data[oldest]

    def pop(self, key: K) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()
