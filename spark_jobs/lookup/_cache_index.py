"""``KeyIndex``: cache key -> position, probed for a whole batch by a few Arrow calls.

The index of a :class:`~spark_jobs.lookup._batch_cache.BatchCache`. Keys are one Arrow array
(``cache_keys``: a key's single part as is, or its parts encoded into one binary value), and
an *entry* maps a key to a position of the cache's ``RowLog``. A batch is probed with
``search_sorted`` over sorted arrays, so a block's keys cost a handful of C loops instead of
one Python dict probe each (and no Python object per key): two sorted *levels*, a large
*base* and a small *delta* holding the entries added since the base was last rebuilt
(re-sorted at each ``add``: only it is). The delta is folded into the base once it holds an
eighth of it (amortised O(1) sorts per entry).

Entries are never removed one by one: an entry whose position the log no longer marks live
(evicted, expired, forgotten, or replaced by a later store of its key) is *stale*, and the
cache reads a probed position's live flag before trusting it; rebuilds of the base drop the
stale entries. A key has at most one live position (a store of a key kills its previous
one) and it is the key's newest entry, so a probe answers a key's newest entry: the delta's
over the base's, and within the delta the newest (new entries are placed before older ones
and the sort is stable: ``search_sorted`` finds the first of equal keys).

Threading contract: not thread-safe; owned by its cache (one event loop thread).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["MIN_DELTA", "KeyIndex", "cache_keys"]

MIN_DELTA = 1024  # entries the delta may hold whatever the base's size
_NONE = pa.scalar(0, pa.int64())  # position 0 is never a row: "no entry"
_SEPARATOR, _ESCAPE, _ESCAPED = b"\x01\x01", b"\x01", b"\x01\x02"


def cache_keys(parts: Sequence[pa.Array]) -> pa.Array:
    """One array of the cache's keys for key ``parts`` (join-typed, aligned): the part itself
    (decimals as their text: ``search_sorted`` has no decimal kernel), or for a composite key
    one binary value per row, its parts as text with every ``\\x01`` escaped as
    ``\\x01\\x02``, joined by ``\\x01\\x01`` (so two keys are equal exactly when their parts
    are). Null when a part is null."""
    if len(parts) == 1:
        part = parts[0]
        return part.cast(pa.string()) if pa.types.is_decimal(part.type) else part
    texts = []
    for part in parts:
        text = part if pa.types.is_binary(part.type) else part.cast(pa.string())
        texts.append(pc.replace_substring(text.cast(pa.binary()), _ESCAPE, _ESCAPED))
    return pc.binary_join_element_wise(*texts, _SEPARATOR)


class _Level:
    """Entries sorted by key (stable: of equal keys, the one given first comes first)."""

    __slots__ = ("at", "keys", "search")

    def __init__(self, keys: pa.Array, at: pa.Array) -> None:
        order = pc.sort_indices(keys)
        self.keys, self.at = keys.take(order), at.take(order)
        # Searched without the last key, a needle's index is always within ``keys``: a
        # needle beyond the last-but-one lands on the last, and matches it or nothing.
        self.search = self.keys.slice(0, len(keys) - 1)

    def __len__(self) -> int:
        return len(self.keys)

    def probe(self, needles: pa.Array, otherwise: pa.Array | pa.Scalar) -> pa.Array:
        """Each needle's position here, else ``otherwise``'s; null for a null needle."""
        where = pc.search_sorted(self.search, needles)
        return pc.if_else(pc.equal(self.keys.take(where), needles), self.at.take(where), otherwise)


class KeyIndex:
    """Keys -> positions, stale entries included (module docstring)."""

    min_delta = MIN_DELTA  # a class attribute: tests lower it to rebuild the base often

    def __init__(self) -> None:
        self._base: _Level | None = None
        self._delta: _Level | None = None

    def probe(self, keys: pa.Array) -> pa.Array:
        """Per key (duplicates and nulls allowed), the position of its newest entry (int64),
        0 without one, null for a null key: a position the caller must check is live."""
        found: pa.Array | pa.Scalar = _NONE
        for level in (self._base, self._delta):  # the delta last: its entries are newer
            if level is not None:
                found = level.probe(keys, found)
        if isinstance(found, pa.Scalar):  # empty: 0, null for a null key
            return pc.if_else(pc.is_valid(keys), _NONE, pa.scalar(None, pa.int64()))
        return found

    def add(self, keys: pa.Array, at: pa.Array, live: pa.Array) -> None:
        """Index ``keys`` at the positions ``at`` (int64), newer than every entry so far (a
        key given twice: the first is the newer). ``live``: the log's live flags by position
        (uint8), for a rebuild of the base."""
        delta, base = self._delta, self._base
        if not len(keys):
            return
        if delta is not None:
            keys, at = pa.concat_arrays([keys, delta.keys]), pa.concat_arrays([at, delta.at])
        if len(keys) <= max(0 if base is None else len(base) // 8, self.min_delta):
            self._delta = _Level(keys, at)
            return
        if base is not None:
            keys, at = pa.concat_arrays([keys, base.keys]), pa.concat_arrays([at, base.at])
        self._base, self._delta = _live_level(keys, at, live), None

    def renumber(self, kept: pa.Array, live: pa.Array) -> None:
        """After the log kept only the positions ``kept`` (int64, ascending; ``live`` the
        flags before), renumbered from 1: one base of the live entries, renumbered."""
        levels = [level for level in (self._delta, self._base) if level is not None]
        self._base = self._delta = None
        if levels:
            keys = pa.concat_arrays([level.keys for level in levels])
            at = pa.concat_arrays([level.at for level in levels])
            alive = pc.not_equal(live.take(at), 0)
            keys, at = keys.filter(alive), at.filter(alive)
            if len(keys):
                moved = pc.add(pc.search_sorted(kept, at).cast(pa.int64()), 1)
                self._base = _Level(keys, moved)

    def clear(self) -> None:
        self._base = self._delta = None


def _live_level(keys: pa.Array, at: pa.Array, live: pa.Array) -> _Level | None:
    """The live entries as a level (one per key: a key's only live position), or None."""
    alive = pc.not_equal(live.take(at), 0)
    keys, at = keys.filter(alive), at.filter(alive)
    return _Level(keys, at) if len(keys) else None
