"""The Arrow side of :class:`~spark_jobs.lookup.BatchLookup`: distinct keys of a batch, the
join of a batch with the rows found for them, and the miss policy.

Keys are arrays in their parts' join types (``_batch_sql.KeyPart.join_type``). A composite
key is matched through one int64 code per row: each part's values are numbered by a
dictionary (the found keys' distinct values), and the numbers are combined in mixed radix.
Should the product of the dictionaries' sizes overflow int64, the codes combined so far are
renumbered densely first (their count is at most the number of found rows), so the
combination never overflows. A row with a null key part never matches.

Threading: pure functions of immutable Arrow data; the mailbox thread calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs._dead_letters import LOOKUP_MISS
from spark_jobs.source._batch import OFFSET, Batch, DeadLetter

__all__ = ["RAW_LIMIT", "Found", "Joiner", "distinct_keys", "join_keys", "match"]

#: Bytes of a dead letter's raw record that are kept.
RAW_LIMIT = 4096
#: Largest combined code of a composite key.
MAX_CODE = 2**63 - 1
_SHOWN = 100  # characters of one key value in a miss reason


@dataclass(frozen=True, slots=True)
class Found:
    """Rows found in the table: key parts (join types) and looked-up columns (output types),
    aligned. The full cache swaps a whole ``Found`` in one assignment."""

    keys: tuple[pa.Array, ...]
    values: tuple[pa.Array, ...]

    def __len__(self) -> int:
        return len(self.keys[0])

    @staticmethod
    def concat(parts: Sequence[Found]) -> Found:
        first = parts[0]
        if len(parts) == 1:
            return first
        return Found(
            tuple(pa.concat_arrays([p.keys[i] for p in parts]) for i in range(len(first.keys))),
            tuple(pa.concat_arrays([p.values[i] for p in parts]) for i in range(len(first.values))),
        )


def join_keys(
    rows: pa.RecordBatch, fields: Sequence[str], types: Sequence[pa.DataType]
) -> list[pa.Array]:
    """The key parts of ``rows`` in their join types."""
    out = []
    for name, kind in zip(fields, types, strict=True):
        column = rows.column(name)
        out.append(column if column.type == kind else column.cast(kind))
    return out


def distinct_keys(keys: Sequence[pa.Array], *, limit: int = MAX_CODE) -> list[pa.Array]:
    """The distinct keys without a null part, one array per part."""
    if len(keys) == 1:
        return [pc.unique(keys[0]).drop_null()]
    dictionaries = [pc.unique(k) for k in keys]
    digits = [
        pc.index_in(k, value_set=d, skip_nulls=True)
        for k, d in zip(keys, dictionaries, strict=True)
    ]
    (codes,) = _mixed_radix([digits], [len(d) for d in dictionaries], limit)
    distinct = pc.unique(codes).drop_null()
    first = pc.index_in(distinct, value_set=codes)  # a code's first row
    return [k.take(first) for k in keys]


def match(
    keys: Sequence[pa.Array], found: Sequence[pa.Array], *, limit: int = MAX_CODE
) -> pa.Array:
    """For each row, the position of its key among the ``found`` keys (the first one when a
    key was found twice); null when the key was not found or has a null part."""
    if len(keys) == 1:
        return pc.index_in(keys[0], value_set=found[0], skip_nulls=True)
    dictionaries = [pc.unique(f) for f in found]
    batch = [
        pc.index_in(k, value_set=d, skip_nulls=True)
        for k, d in zip(keys, dictionaries, strict=True)
    ]
    rows = [pc.index_in(f, value_set=d) for f, d in zip(found, dictionaries, strict=True)]
    batch_codes, found_codes = _mixed_radix([batch, rows], [len(d) for d in dictionaries], limit)
    return pc.index_in(batch_codes, value_set=found_codes, skip_nulls=True)


def _mixed_radix(
    sides: Sequence[Sequence[pa.Array]], radices: Sequence[int], limit: int
) -> list[pa.Array]:
    """One int64 code per row of each side from its per-part digits (``digits < radix``).

    The last side is the reference: when the next radix could overflow ``limit``, every
    side's codes are renumbered by the reference's distinct codes (a code the reference does
    not have becomes null: it matches nothing there).
    """
    codes = [digits[0].cast(pa.int64()) for digits in sides]
    radix = radices[0]
    for part in range(1, len(radices)):
        if radix * radices[part] > limit:
            dictionary = pc.unique(codes[-1])
            codes = [
                pc.index_in(c, value_set=dictionary, skip_nulls=True).cast(pa.int64())
                for c in codes
            ]
            radix = len(dictionary)
            if radix * radices[part] > limit:  # more distinct values than int64 can hold
                raise OverflowError("composite key codes overflow int64")
        codes = [
            pc.add(pc.multiply(code, radices[part]), digits[part].cast(pa.int64()))
            for code, digits in zip(codes, sides, strict=True)
        ]
        radix *= radices[part]
    return codes


class Joiner:
    """Builds a step's output batch: the input's user columns, the looked-up columns (under
    their output names, in the plan's order) and the offset column last; then the miss policy
    ``keep`` (nulls), ``drop`` or ``dead_letter``.

    ``misses`` of the output counts the unmatched rows whose key is complete (a retry may
    still find them; a row with a null key part never matches and does not ask for one).
    """

    def __init__(
        self,
        input_schema: pa.Schema,
        added: Sequence[pa.Field],
        key_fields: Sequence[str],
        on_miss: str,
        qualified: str,
    ) -> None:
        user = [f for f in input_schema if f.name != OFFSET]
        self.schema = pa.schema([*user, *added, pa.field(OFFSET, pa.int64(), nullable=False)])
        self._user_count = len(user)
        self._key_fields = tuple(key_fields)
        self._on_miss = on_miss
        self._qualified = qualified

    def join(
        self, batch: Batch, keys: Sequence[pa.Array], positions: pa.Array, found: Found
    ) -> Batch:
        """The output of ``batch`` whose rows' ``keys`` are at ``positions`` in ``found``."""
        added = [column.take(positions) for column in found.values]
        return self.join_added(batch, keys, positions, added)

    def join_added(
        self, batch: Batch, keys: Sequence[pa.Array], matched: pa.Array, added: Sequence[pa.Array]
    ) -> Batch:
        """The output of ``batch`` with the looked-up columns ``added`` (one value per row);
        ``matched`` is null for the rows whose key was not found."""
        rows = batch.rows
        if rows.num_columns != self._user_count + 1 or rows.schema.names[-1] != OFFSET:
            raise ValueError(
                f"a batch must hold the step's {self._user_count} input fields and {OFFSET} "
                f"last; got {rows.schema.names}"
            )
        columns = rows.columns
        out = pa.RecordBatch.from_arrays([*columns[:-1], *added, columns[-1]], schema=self.schema)
        unmatched = matched.null_count
        dead, dropped = batch.dead, batch.dropped
        if unmatched:
            complete = pc.is_valid(keys[0])
            for key in keys[1:]:
                complete = pc.and_(complete, pc.is_valid(key))
            missed = pc.invert(pc.is_valid(matched))
            misses = pc.sum(pc.and_(missed, complete)).as_py() or 0
            if self._on_miss == "drop":
                out = out.filter(pc.invert(missed))
                dropped += unmatched
            elif self._on_miss == "dead_letter":
                out = out.filter(pc.invert(missed))
                dead = [*dead, *self._dead_letters(rows.filter(missed))]
        else:
            misses = 0
        return Batch(
            batch.split_id,
            out,
            batch.span,
            only=batch.only,
            dead=list(dead),
            dropped=dropped,
            misses=misses,
        )

    def _dead_letters(self, rows: pa.RecordBatch) -> list[DeadLetter]:
        offsets = rows.column(OFFSET).to_pylist()
        records = rows.drop_columns([OFFSET]).to_pylist()
        letters = []
        for offset, record in zip(offsets, records, strict=True):
            raw = orjson.dumps(record, default=str)[:RAW_LIMIT]
            key = ", ".join(f"{name}={_show(record[name])}" for name in self._key_fields)
            letters.append((offset, raw, f"{LOOKUP_MISS}: {self._qualified} has no row for {key}"))
        return letters


def _show(value: Any) -> str:
    if value is None:
        return "null"
    text = orjson.dumps(value).decode() if isinstance(value, str) else str(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
