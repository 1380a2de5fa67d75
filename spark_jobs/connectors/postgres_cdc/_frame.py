"""Column-wise framing of a block of pgoutput change messages with NumPy.

The block's payloads are joined into one byte buffer; every step below runs over all
messages at once (vectorised array operations, no Python per message or per value):

- each message's kind (``I``/``U``), relation id, tuple marker (``N``: a new tuple without an
  old one) and column count (:attr:`Frame.candidates`, :attr:`Frame.relids`);
- for the candidates of one relation, column after column: the value's tag (``t`` text,
  ``n`` null; anything else — ``u`` an unchanged TOASTed value, a binary value — stops that
  message), its big-endian length and its bytes, gathered into one binary array per column
  (one fancy-indexed copy out of the buffer). A message whose walk leaves its bounds or does
  not end exactly at its end is not ``ok``: the caller decodes it the per-message way, which
  gives its exact error or meaning.

Why NumPy and not Arrow compute (the first design): a message's fields are single bytes and
big-endian integers at computed positions; Arrow has no gather of bytes by position cheaper
than a ``take`` plus a ``cast`` per byte, and building the gather's per-byte index took five
kernels. The same steps in NumPy cost a third of the framing's CPU, which was the largest
part of decoding a change (``bench/e2e.py``'s CDC row). The results are Arrow arrays.

Threading: plain values; the fetcher thread builds and uses one per block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["Frame"]

_T, _N = 116, 110  # value tags 't' and 'n'
_Ints = npt.NDArray[np.int64]
_Mask = npt.NDArray[np.bool_]


class Frame:
    """The framing of one block's payloads (see the module docstring)."""

    def __init__(self, payloads: Sequence[bytes]) -> None:
        data = b"".join(payloads)
        #: Beyond int32 offsets: the caller decodes the block the per-message way.
        self.too_big = len(data) >= 1 << 31
        # (One zero byte stands in for an empty block: every read below is clamped into it.)
        self._flat = np.frombuffer(data or b"\0", np.uint8)
        self._last = len(self._flat) - 1
        lengths = np.fromiter(map(len, payloads), np.int64, len(payloads))
        self._ends = np.cumsum(lengths)
        self._starts = self._ends - lengths
        long = lengths >= 8
        starts = np.where(long, self._starts, 0)  # (short ones are never candidates)
        kind = self._byte(starts)
        marker = self._byte(starts + 5)
        inserts = long & (kind == ord("I"))
        update = kind == ord("U")
        old = (marker == ord("K")) | (marker == ord("O"))
        #: Messages the column walk may take: inserts and updates without an old tuple (their
        #: new tuple), deletes (their old tuple: the key columns, or the whole row).
        self.candidates = pa.array(long & (inserts | update) & (marker == ord("N")))
        self.deletes = pa.array(long & (kind == ord("D")) & old)
        self.inserts = pa.array(inserts)
        self.relids = pa.array(self._int(starts + 1, 4))
        self._ncols = self._int(starts + 6, 2)

    def _byte(self, at: _Ints) -> _Ints:
        picked: _Ints = self._flat[np.minimum(at, self._last)].astype(np.int64)
        return picked

    def _int(self, at: _Ints, width: int) -> _Ints:
        """Unsigned big-endian integers of ``width`` bytes at ``at``."""
        value = self._byte(at)
        for i in range(1, width):
            value = (value << 8) | self._byte(at + i)
        return value

    def tuples(self, rows: pa.Array, ncols: int) -> tuple[pa.Array, list[pa.Array]]:
        """The tuples of messages ``rows`` (candidates or deletes of one relation with
        ``ncols`` columns; each message ends with its tuple): which ones framed ``ok`` and
        each column's raw values (binary; null for ``n``), for every row (meaningless where
        not ok)."""
        picked = rows.to_numpy(zero_copy_only=False).astype(np.int64)
        end = self._ends[picked]
        at = self._starts[picked] + 8
        ok = self._ncols[picked] == ncols
        starts, sizes, valid = [], [], []
        for _ in range(ncols):
            tag = self._byte(at)
            text = tag == _T
            size = self._int(at + 1, 4)
            after = at + 5 + size
            good_text = text & (size < 1 << 31) & (after <= end)
            ok &= (at < end) & (good_text | (tag == _N))
            value = ok & text
            starts.append(at + 5)
            sizes.append(np.where(value, size, 0))
            valid.append(value)
            at = np.where(ok, np.where(text, after, at + 1), at)
        count = len(picked)
        raw = self._gather(np.concatenate(starts), np.concatenate(sizes), np.concatenate(valid))
        columns = [raw.slice(c * count, count) for c in range(ncols)]
        return pa.array(ok & (at == end)), columns

    def _gather(self, start: _Ints, size: _Ints, valid: _Mask) -> pa.Array:
        """A binary array of the bytes ``[start, start + size)`` (null where not valid): one
        fancy index of the buffer at ``start + 0, 1, ...`` of each value."""
        offsets = np.zeros(len(size) + 1, np.int64)
        np.cumsum(size, out=offsets[1:])
        total = int(offsets[-1])
        # Byte j of the output is at (its value's start) + (j - its value's first byte).
        index = np.repeat(start - offsets[:-1], size) + np.arange(total, dtype=np.int64)
        data = self._flat[index]
        bitmap = pa.array(valid).buffers()[1]
        return pa.Array.from_buffers(
            pa.binary(),
            len(size),
            [bitmap, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        )
