"""Column-wise framing of a block of pgoutput change messages with Arrow compute.

The block's payloads are joined into one byte buffer; every step below runs over all
messages at once (Arrow kernels, no Python per message or per value):

- each message's kind (``I``/``U``), relation id, tuple marker (``N``: a new tuple without an
  old one) and column count (:attr:`Frame.candidates`, :attr:`Frame.relids`);
- for the candidates of one relation, column after column: the value's tag (``t`` text,
  ``n`` null; anything else — ``u`` an unchanged TOASTed value, a binary value — stops that
  message), its big-endian length and its bytes, gathered into one binary array per column
  (a list view over the buffer, flattened). A message whose walk leaves its bounds or does
  not end exactly at its end is not ``ok``: the caller decodes it the per-message way, which
  gives its exact error or meaning.

Threading: plain values; the fetcher thread builds and uses one per block.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Frame"]

_T, _N = 116, 110  # value tags 't' and 'n'


class Frame:
    """The framing of one block's payloads (see the module docstring)."""

    def __init__(self, payloads: Sequence[bytes]) -> None:
        data = b"".join(payloads)
        #: Beyond int32 offsets: the caller decodes the block the per-message way.
        self.too_big = len(data) >= 1 << 31
        lengths = pa.array(list(map(len, payloads)), pa.int64())
        self.ends = pc.cumulative_sum(lengths)
        self.starts = pc.subtract(self.ends, lengths)
        self._size = len(data)
        self._flat = pa.Array.from_buffers(pa.uint8(), len(data), [None, pa.py_buffer(data)])
        self._last = max(len(data) - 1, 0)
        long = pc.greater_equal(lengths, 8)
        starts = pc.if_else(long, self.starts, 0)  # (short ones are never candidates)
        kind = self._byte(starts)
        update = pc.equal(kind, ord("U"))
        self.inserts = pc.and_(long, pc.equal(kind, ord("I")))
        marker = self._byte(pc.add(starts, 5))
        #: Messages the column walk may take: inserts and updates without an old tuple (their
        #: new tuple), deletes (their old tuple: the key columns, or the whole row).
        self.candidates = pc.and_(
            pc.and_(long, pc.or_(self.inserts, update)), pc.equal(marker, ord("N"))
        )
        old = pc.or_(pc.equal(marker, ord("K")), pc.equal(marker, ord("O")))
        self.deletes = pc.and_(pc.and_(long, pc.equal(kind, ord("D"))), old)
        self.relids = self._int(pc.add(starts, 1), 4)
        self.ncols = self._int(pc.add(starts, 6), 2)

    def _byte(self, at: pa.Array) -> pa.Array:
        return pc.cast(pc.take(self._flat, pc.min_element_wise(at, self._last)), pa.int64())

    def _int(self, at: pa.Array, width: int) -> pa.Array:
        """Unsigned big-endian integers of ``width`` bytes at ``at``."""
        value = self._byte(at)
        for i in range(1, width):
            value = pc.add(pc.multiply(value, 256), self._byte(pc.add(at, i)))
        return value

    def tuples(self, rows: pa.Array, ncols: int) -> tuple[pa.Array, list[pa.Array]]:
        """The tuples of messages ``rows`` (candidates or deletes of one relation with
        ``ncols`` columns; each message ends with its tuple): which ones framed ``ok`` and
        each column's raw values (binary; null for ``n``), for every row (meaningless where
        not ok)."""
        end = pc.take(self.ends, rows)
        at = pc.add(pc.take(self.starts, rows), 8)
        ok = pc.equal(pc.take(self.ncols, rows), ncols)
        starts, sizes, valid = [], [], []
        for _ in range(ncols):
            tag = self._byte(at)
            text = pc.equal(tag, _T)
            size = self._int(pc.add(at, 1), 4)
            after = pc.add(pc.add(at, 5), size)
            good_text = pc.and_(text, pc.and_(pc.less(size, 1 << 31), pc.less_equal(after, end)))
            ok = pc.and_(ok, pc.and_(pc.less(at, end), pc.or_(good_text, pc.equal(tag, _N))))
            value = pc.and_(ok, text)
            starts.append(pc.add(at, 5))
            sizes.append(pc.if_else(value, size, 0))
            valid.append(value)
            at = pc.if_else(ok, pc.if_else(text, after, pc.add(at, 1)), at)
        count = len(rows)
        raw = self._gather(pa.concat_arrays(starts), pa.concat_arrays(sizes), valid)
        columns = [raw.slice(c * count, count) for c in range(ncols)]
        return pc.and_(ok, pc.equal(at, end)), columns

    def _gather(self, start: pa.Array, size: pa.Array, valid: list[pa.Array]) -> pa.Array:
        """A binary array of the bytes ``[start, start + size)`` (null where not valid): one
        ``take`` of the buffer at ``start + 0, 1, ...`` of each value (a run-end decoded
        shift added to a running index)."""
        total = pc.sum(size).as_py() or 0
        offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(size)])
        if total:
            nonempty = pc.greater(size, 0)
            starts, sizes = pc.filter(start, nonempty), pc.filter(size, nonempty)
            ends = pc.cumulative_sum(sizes)
            shift = pc.subtract(starts, pc.subtract(ends, sizes))
            runs = pa.RunEndEncodedArray.from_arrays(pc.cast(ends, pa.int32()), shift)
            ones = pc.fill_null(pa.nulls(total, pa.int64()), 1)
            index = pc.add(pc.run_end_decode(runs), pc.subtract(pc.cumulative_sum(ones), 1))
            data = _values(pc.take(self._flat, index))
        else:
            data = pa.py_buffer(b"")
        mask = pa.concat_arrays(valid)
        bitmap = _values(mask) if mask.offset == 0 else _values(pa.concat_arrays([mask]))
        return pa.Array.from_buffers(
            pa.binary(), len(size), [bitmap, pc.cast(offsets, pa.int32()).buffers()[1], data]
        )


def _values(data: pa.Array) -> pa.Buffer | None:
    """The value buffer of an array (copied when it is a slice)."""
    if data.offset:
        data = pa.concat_arrays([data])
    return data.buffers()[1]
