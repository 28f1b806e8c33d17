"""The CUDA backend's per-call cache: layout key -> kept entry (a plan and what its later calls replay), bounded in
device bytes, safe under threads, streams and CUDA graph capture.

* Keys hold the caller's stream (one entry per layout and stream: an entry's kept buffers are reused in that
  stream's order).  :meth:`CallCache.entry` finds a layout's entry for the calling stream; while the stream is
  being captured into a CUDA graph and the layout has an entry on another stream only (the warm-up of the
  documented torch recipe, run on a side stream), that entry moves to the capture stream: the recipe synchronises
  before capture, so its earlier work has finished.
* An entry used in a capture belongs to that graph: the graph keeps it alive (a CUDA user object,
  ``device.keep_for_graph``) and it leaves the cache once the capture is over (the next eager call of the layout
  builds a new entry), so eager calls never write buffers a graph replays.
* The bound: entries' own device bytes (kept buffers, workspaces; not the staged forms cached on quantized
  operands, which their objects own); the oldest entries go first (insertion order: a hit does not reorder, so a
  call costs one dict lookup).  ``MXCORE_CACHE_BYTES`` (bytes) or
  ``mxcore.set_cache_limit`` set it.
"""

from __future__ import annotations

import os
import threading

from .device import (_RELEASED, capture_graph, capturing, device_bytes, external_stream, keep_for_graph,
                     release_destroyed_graphs)

__all__ = ["CallCache", "DEFAULT_LIMIT"]

DEFAULT_LIMIT = 4 << 30  # activation-sized buffers per layout: a 70B-class model has ~7 layouts per token count


def _limit_from_env() -> int:
    from mxcore.api import configured_cache_limit

    if configured_cache_limit() is not None:
        return configured_cache_limit()
    raw = os.environ.get("MXCORE_CACHE_BYTES")
    if raw is None:
        return DEFAULT_LIMIT
    try:
        value = int(float(raw))
    except ValueError:
        from mxcore.errors import UnsupportedError

        raise UnsupportedError(f"MXCORE_CACHE_BYTES={raw!r} is not a number of bytes; set it to e.g. 4e9") from None
    return max(value, 0)


def _stream_at(key) -> int:
    """Where a key holds the stream: ("qq", ordinal, stream, ...); ("q" | "w", kind, ordinal, stream, ...); the
    float path's (kind, ordinal, ordinal_b, stream, ...)."""
    return 2 if key[0] == "qq" else 3


def _layout(key) -> tuple:
    i = _stream_at(key)
    return key[:i] + key[i + 1:]


class CallCache(dict):
    """A dict of layout keys to entries, bounded in the entries' device bytes, the oldest dropped first (see the module
    doc).  The per-call paths read it with :meth:`entry` and write it with ``cache[key] = entry`` under the backend's
    lock."""

    def __init__(self):
        super().__init__()
        self.lock = threading.RLock()
        self.limit = _limit_from_env()
        self._bytes: dict = {}
        self._by_layout: dict = {}  # layout (key without the stream) -> keys
        self._captured: dict = {}  # key -> the graph whose capture used its entry (it leaves the cache after)
        self.hits = self.misses = self.evictions = 0
        self.capturing = False  # whether the last entry() call's stream was being captured

    # ---- reads --------------------------------------------------------------------------------------------
    def entry(self, key, cp=None, stream_h: int | None = None):
        """The entry for ``key`` (None: none kept).  With ``cp`` and ``stream_h`` (the key's stream): a capture
        takes over the layout's entry of another stream and ties the entry to the graph being captured; an eager
        call drops an entry that a finished capture used (the graph keeps it)."""
        if _RELEASED:
            release_destroyed_graphs()
        hit = dict.get(self, key)
        if cp is None:
            return hit
        self.capturing = capturing(cp, stream_h)  # read by the caller under the lock (what else the graph keeps)
        if not self.capturing:
            if self._captured and key in self._captured:
                del self._captured[key]
                self.pop(key, None)
                hit = None
            if hit is None:
                self.misses += 1
            else:
                self.hits += 1
            return hit
        if hit is None:
            hit = self._adopt(key, cp, stream_h)
            if hit is None:
                self.misses += 1
                return None
        self.hits += 1
        graph = capture_graph(stream_h)
        if hit is not False and graph is not None and self._captured.get(key) != graph:
            keep_for_graph(stream_h, hit)
            self._captured[key] = graph
        return hit

    def _adopt(self, key, cp, stream_h: int):
        """Move the layout's entry of another stream to ``key``'s (capture) stream."""
        layout = _layout(key)
        for other in list(self._by_layout.get(layout, ())):
            if other == key or other in self._captured:
                continue
            hit = dict.get(self, other)
            if not hit:
                continue
            size = self._bytes.get(other, 0)
            self.pop(other, None)
            _restream(hit, external_stream(cp, stream_h))
            dict.__setitem__(self, key, hit)
            self._bytes[key] = size
            self._by_layout.setdefault(_layout(key), set()).add(key)
            return hit
        return None

    # ---- writes -------------------------------------------------------------------------------------------
    def __setitem__(self, key, value) -> None:
        if dict.__contains__(self, key):
            self.pop(key, None)
        dict.__setitem__(self, key, value)
        size = device_bytes(value, exclude=_weights_own()) if value else 0
        self._bytes[key] = size
        self._by_layout.setdefault(_layout(key), set()).add(key)
        self._evict()

    def pop(self, key, default=None):
        if not dict.__contains__(self, key):
            return default
        self._bytes.pop(key, None)
        keys = self._by_layout.get(_layout(key))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_layout[_layout(key)]
        return dict.pop(self, key)

    def __delitem__(self, key) -> None:
        if not dict.__contains__(self, key):
            raise KeyError(key)
        self.pop(key)

    def clear(self) -> None:
        dict.clear(self)
        self._bytes.clear()
        self._by_layout.clear()
        self._captured.clear()
        release_destroyed_graphs()

    def _evict(self) -> None:
        while len(self) > 1 and self.nbytes > self.limit:
            oldest = next((k for k in self if k not in self._captured), None)
            if oldest is None:
                return
            self.pop(oldest)
            self.evictions += 1

    @property
    def nbytes(self) -> int:
        return sum(self._bytes.values())

    def set_limit(self, limit: int) -> None:
        self.limit = int(limit)
        self._evict()

    def info(self) -> dict:
        return {"entries": len(self), "bytes": self.nbytes, "limit": self.limit, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions, "captured": len(self._captured)}


def _weights_own() -> set:
    """Allocations that staged forms cached on quantized objects hold (their objects own them: an entry's bound
    plans point at them, but dropping the entry frees none of them)."""
    from .device import allocations
    from .stage import _STAGED

    return allocations(list(_STAGED.values()))


def _restream(entry, stream) -> None:
    """Point every plan inside ``entry`` (tuples, the bound plans of a kept layout) at CuPy stream ``stream``."""
    stack, seen = [entry], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif hasattr(x, "stream") and hasattr(x, "dev"):
            x.stream = stream
            parts = getattr(x, "parts", None)
            if parts:
                stack.extend(parts)
