"""The catalogue of dead-letter reasons: every reason a record can be rejected with.

A dead letter is a record Sluice could not turn into an output row; the run goes on without
it and keeps it in the platform database's ``sluice.dead_letters`` table (one row per record:
its split, its offset, its raw bytes and a reason). A reason is ``"<category>: <detail>"``
(``late`` alone has no detail). The categories are the constants below; the code that rejects
a record builds its reason with :func:`reason` (or an f-string starting with the constant), and
``tests/unit/test_dead_letter_catalogue.py`` checks that every reason the readers, lookups and
steps emit starts with a catalogued category. The documentation's dead-letter reference is
generated from :data:`CATEGORIES`.

Threading: constants only, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BAD_VALUE",
    "CATEGORIES",
    "COLUMNS",
    "INVALID_CSV",
    "INVALID_JSON",
    "INVALID_UTF8",
    "LATE",
    "LINE_TOO_LONG",
    "LOOKUP_MISS",
    "LOST",
    "MISSING_FIELD",
    "WRONG_TYPE",
    "Category",
    "Column",
    "category_of",
    "reason",
]

LINE_TOO_LONG = "line too long"
INVALID_UTF8 = "invalid UTF-8"
INVALID_JSON = "invalid JSON"
INVALID_CSV = "invalid CSV"
MISSING_FIELD = "missing field"
WRONG_TYPE = "wrong type"
BAD_VALUE = "bad value"
LOOKUP_MISS = "lookup miss"
LATE = "late"
LOST = "lost"


@dataclass(frozen=True, slots=True)
class Category:
    """One kind of dead letter: what it means, which part of Sluice emits it, an example of
    its reason, and what to do about it."""

    name: str
    meaning: str
    emitted_by: str
    example: str
    action: str


CATEGORIES: tuple[Category, ...] = (
    Category(
        LINE_TOO_LONG,
        "A JSON Lines or CSV line is longer than `SLUICE_MAX_LINE_BYTES`; it is not parsed.",
        "the line readers of `FileSource` (JSON Lines and CSV, plain or gzip)",
        "line too long: over 1048576 bytes",
        "Raise `SLUICE_MAX_LINE_BYTES` if such lines are legitimate, then rebuild the day "
        "(`sluice run --date D --replace`); else fix the producer.",
    ),
    Category(
        INVALID_UTF8,
        "A line, or a text field of a Parquet file or table, is not valid UTF-8.",
        "the JSON Lines and CSV readers (whole line); `KafkaSource` (a message value that is "
        "not UTF-8, formats `json` and `csv`); conversion of `string`/`binary` fields read from "
        "Parquet or Postgres",
        "invalid UTF-8: line is not valid UTF-8 text",
        "Fix the producer's encoding (Sluice reads UTF-8 only; a UTF-8 byte-order mark at the "
        "start of a file is accepted).",
    ),
    Category(
        INVALID_JSON,
        "A JSON Lines line does not parse as JSON; the detail is the parser's message.",
        'the JSON Lines reader; `KafkaSource` with `format="json"` (the detail ends with '
        "the message key)",
        "invalid JSON: unexpected character: line 1 column 9 (char 8)",
        "Fix the producer; a blank line is not a dead letter (it is skipped).",
    ),
    Category(
        INVALID_CSV,
        "A CSV line does not parse: unbalanced quotes (quoted fields spanning lines are not "
        "supported) or another error of Python's `csv` module in strict mode.",
        "the CSV reader",
        "invalid CSV: unbalanced quotes (quoted fields spanning lines are not supported)",
        "Fix the producer: one record per line, quotes balanced.",
    ),
    Category(
        MISSING_FIELD,
        "A field listed in the source's `required` is absent or null (an empty CSV field is "
        "null). The detail lists every missing required field, in declaration order.",
        "every source (`FileSource` in every format, `TableSource`, `KafkaSource`, "
        "`PostgresCdcSource`)",
        "missing field: user_id, ts",
        "Fix the producer, or drop the field from `required` and handle nulls in a step.",
    ),
    Category(
        WRONG_TYPE,
        "A value has a JSON type (or CSV text) that cannot be its declared field type: e.g. "
        '`1.0`, `true` or `"5"` for an integer field; also a JSON Lines line that is not an '
        "object.",
        "every source's record conversion",
        "wrong type: amount must be a number, got 'n/a'",
        "Fix the producer, or declare the field with the type the data has (e.g. `string`) "
        "and convert it in a `Map`.",
    ),
    Category(
        BAD_VALUE,
        "A value has the right kind but does not fit: out of the type's range, not finite, "
        "more digits than `decimal(p,s)` holds, not ISO-8601 or `YYYY-MM-DD`; a CSV row with "
        "another number of fields than the header; a Parquet value Python cannot hold; or a "
        'result of an `AsyncMap` with `per="record"` whose value does not fit its declared '
        "type (the detail then names the step and the field). A `Map`'s or a per-batch "
        "`AsyncMap`'s output that does not fit is a bug in the step: the run stops (exit "
        "code 5) with one line naming the step and the field.",
        "every source's record conversion; the CSV reader (field count); per-record `AsyncMap` "
        "results",
        "bad value: qty 300 is outside the int8 range",
        "Fix the producer, or widen the declared type (e.g. `int64`, a larger `decimal`); for "
        "a step, fix the function's output or its declared `output` types.",
    ),
    Category(
        LOOKUP_MISS,
        'A `Lookup` with `on_miss="dead_letter"` (or a `RetryOnMiss(then="dead_letter")` '
        "whose attempts ran out) found no row for the record's key.",
        "`Lookup` steps",
        "lookup miss: public.users has no row for user_id=42",
        "Add the missing rows to the lookup table and rebuild the day, or use "
        '`on_miss="keep"` (nulls) or `RetryOnMiss` for rows that arrive later.',
    ),
    Category(
        LOST,
        "Messages a Kafka partition's split had not read yet were deleted (retention) before "
        'it read them, and the source has `on_offset_out_of_range="earliest"`: reading went '
        "on at the earliest offset left. One dead letter per gap, at its first offset, with "
        "no raw bytes.",
        "the `KafkaSource` reader",
        "lost: 120 messages (offsets 40-159 of clicks/3) deleted by retention before they "
        "were read",
        "Read the topic more often or keep messages longer; use "
        '`on_offset_out_of_range="fail"` to stop instead of losing them.',
    ),
    Category(
        LATE,
        "The record's event day is an output partition already recorded complete, and the "
        'source has `late_records="dead_letter"`. The reason is exactly `late`.',
        "the sink stage (day-partitioned output with `event_time`)",
        "late",
        "Rebuild the day (`sluice run --date D --replace`) to include its late records, or "
        'use `late_records="reopen"`.',
    ),
)


@dataclass(frozen=True, slots=True)
class Column:
    """A column of the ``sluice.dead_letters`` table."""

    name: str
    type: str
    meaning: str


COLUMNS: tuple[Column, ...] = (
    Column("id", "bigint", "Identity of the dead letter."),
    Column("split_id", "bigint", "The split the record was read from (`sluice.splits.id`)."),
    Column("source", "text", "The pipeline (its split source) that rejected the record."),
    Column("uri", "text", "The file (or table) of the split."),
    Column(
        "offset",
        "bigint",
        "Where the record is in its split: the byte offset of its line in the file (JSON "
        "Lines, CSV; of the uncompressed stream for gzip), the row number in the file "
        "(Parquet), the key value (`TableSource`), or the message's offset in its partition "
        "(`KafkaSource`; `uri` is `<topic>/<partition>`). With `split_id` it is unique: a split "
        "re-read after a crash rejects the same record once.",
    ),
    Column(
        "raw",
        "bytea",
        "At most the first 4 KiB of the rejected input. For a line that failed to parse, "
        "the line's bytes. For a Parquet or table row, a JSON rendering of the row. For a "
        "record rejected after it was read (`lookup miss`, `late`, an `AsyncMap` result's "
        "`bad value`), a JSON rendering of the record as it reached that step (for an "
        "`AsyncMap` result, with the result's fields) — not the input line.",
    ),
    Column("reason", "text", "`<category>: <detail>`, the categories below."),
    Column("run_id", "text", "The run that rejected the record."),
    Column("created_at", "timestamptz", "When the dead letter was committed."),
    Column(
        "rebuild_id",
        "bigint",
        "The rebuild (`--replace`, a Dagster re-materialisation) that rejected it; null for "
        "incremental processing. A rebuild's swap deletes the day's dead letters of earlier "
        "generations.",
    ),
    Column(
        "partition_key",
        "date",
        "The output partition (day) the dead letter counts on: a reader's, the split's "
        "landing day; a step's, the record's event day.",
    ),
)


def reason(category: str, detail: str | None = None) -> str:
    """The reason text of a dead letter of ``category`` (one of the constants)."""
    return category if detail is None else f"{category}: {detail}"


def category_of(text: str) -> Category | None:
    """The catalogued category a reason starts with, or None."""
    for category in CATEGORIES:
        if text == category.name or text.startswith(f"{category.name}: "):
            return category
    return None
