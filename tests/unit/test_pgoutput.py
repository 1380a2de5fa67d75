"""The pgoutput decoder on messages captured from the test server (PostgreSQL 18, protocol
version 1): a publication of ``public.t`` (default replica identity, eight column types) and
``public.f`` (``REPLICA IDENTITY FULL``), then, one transaction each: two inserts, an update,
a key change (id 2 -> 3), a delete, an insert/update/delete of ``f``, and a TRUNCATE of
``t`` — and the rows :class:`ChangeRows` makes of them."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime

import orjson
import pytest

from spark_jobs.connectors.postgres_cdc._changes import CdcError, ChangeRows
from spark_jobs.connectors.postgres_cdc._markers import MARKER_PREFIX, marker_time
from spark_jobs.connectors.postgres_cdc._pgoutput import (
    UNCHANGED,
    Begin,
    Change,
    Column,
    Commit,
    DecodeError,
    Marker,
    Relation,
    decode,
    from_text,
)

CAPTURED = [
    "420000000001afabf00003043885f1b5de000002f5",
    "52000040017075626c69630074006400080169640000000014ffffffff006e616d650000000019ffffffff00616d6f756e7400000006a4000a000600617400000004a0ffffffff00666c61670000000010ffffffff00646174610000000011ffffffff0061727200000003efffffffff006a0000000edaffffffff",
    "49000040014e00087400000001317400000001617400000004312e35307400000016323032362d30312d30312030303a30303a30302b303074000000017474000000065c783031303274000000057b312c327d74000000087b226b223a20317d",
    "49000040014e00087400000001326e6e6e6e6e6e6e",
    "43000000000001afabf00000000001afac200003043885f1b5de",
    "420000000001afacc00003043885f1c50a000002f6",
    "55000040014e00087400000001317400000001627400000004312e35307400000016323032362d30312d30312030303a30303a30302b303074000000017474000000065c783031303274000000057b312c327d74000000087b226b223a20317d",
    "43000000000001afacc00000000001afacf00003043885f1c50a",
    "420000000001afad880003043885f1e2eb000002f7",
    "55000040014b00087400000001326e6e6e6e6e6e6e4e00087400000001336e6e6e6e6e6e6e",
    "43000000000001afad880000000001afadb80003043885f1e2eb",
    "420000000001afae000003043885f1f238000002f8",
    "44000040014b00087400000001316e6e6e6e6e6e6e",
    "43000000000001afae000000000001afae300003043885f1f238",
    "420000000001afaf100003043885f202af000002f9",
    "52000040097075626c69630066006600020169640000000017ffffffff01760000000019ffffffff",
    "49000040094e0002740000000131740000000178",
    "43000000000001afaf100000000001afaf400003043885f202af",
    "420000000001afaf980003043885f2117d000002fa",
    "55000040094f00027400000001317400000001784e0002740000000131740000000179",
    "43000000000001afaf980000000001afafc80003043885f2117d",
    "420000000001afb0100003043885f21cf4000002fb",
    "44000040094f0002740000000131740000000179",
    "43000000000001afb0100000000001afb0400003043885f21cf4",
    "420000000001afbbc00003043885f2237e000002fc",
    "52000040017075626c69630074006400080169640000000014ffffffff006e616d650000000019ffffffff00616d6f756e7400000006a4000a000600617400000004a0ffffffff00666c61670000000010ffffffff00646174610000000011ffffffff0061727200000003efffffffff006a0000000edaffffffff",
    "54000000010000004001",
    "43000000000001afbbc00000000001afbd300003043885f2237e",
]


def messages() -> list[object]:
    return [decode(bytes.fromhex(h)) for h in CAPTURED]


def test_every_captured_message_decodes_to_its_kind() -> None:
    kinds = "".join(type(m).__name__[:2] for m in messages())
    assert kinds == "BeReChChCoBeChCoBeChCoBeChCoBeReChCoBeChCoBeChCoBeReTrCo"


def test_begin_and_commit_carry_the_commit_lsn_and_time() -> None:
    begin, commit = messages()[0], messages()[4]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.commit_lsn == commit.commit_lsn == 0x1AFABF0
    assert commit.end_lsn == 0x1AFAC20
    assert begin.commit_time == commit.commit_time
    assert begin.commit_time.tzinfo is not None and begin.commit_time.year == 2026


def test_a_relation_lists_columns_types_and_the_key() -> None:
    relation = messages()[1]
    assert isinstance(relation, Relation)
    assert (relation.qualified, relation.replica_identity) == ("public.t", "d")
    assert [(c.name, c.type_oid, c.key) for c in relation.columns] == [
        ("id", 20, True), ("name", 25, False), ("amount", 1700, False), ("at", 1184, False),
        ("flag", 16, False), ("data", 17, False), ("arr", 1007, False), ("j", 3802, False),
    ]  # fmt: skip


def test_inserts_updates_and_deletes_with_their_old_tuples() -> None:
    found = messages()
    insert, null_row = found[2], found[3]
    assert isinstance(insert, Change) and isinstance(null_row, Change)
    assert insert.op == "c" and insert.new is not None and insert.new[:3] == ("1", "a", "1.50")
    assert null_row.new == ("2", None, None, None, None, None, None, None)
    key_change = found[9]
    assert isinstance(key_change, Change)
    assert (key_change.op, key_change.old_kind) == ("u", "K")
    assert key_change.old is not None and key_change.old[0] == "2"
    assert key_change.new is not None and key_change.new[0] == "3"
    delete = found[12]
    assert isinstance(delete, Change) and (delete.op, delete.old_kind, delete.new) == (
        "d",
        "K",
        None,
    )
    full_update = found[19]
    assert isinstance(full_update, Change) and full_update.old_kind == "O"
    assert (full_update.old, full_update.new) == (("1", "x"), ("1", "y"))


def test_text_values_convert_by_type_oid() -> None:
    assert from_text(20, "12") == 12
    # numeric stays text: exact for a string field, parsed by a decimal field's converter.
    assert from_text(1700, "1.50") == "1.50"
    assert from_text(1700, "0.00000000000000000001") == "0.00000000000000000001"
    assert from_text(16, "t") is True and from_text(16, "f") is False
    assert from_text(17, "\\x0102") == b"\x01\x02"
    assert from_text(1184, "2026-01-01 00:00:00+00") == datetime(2026, 1, 1, tzinfo=UTC)
    assert from_text(1114, "2026-01-01 10:00:00") == datetime(2026, 1, 1, 10)
    assert from_text(1082, "2026-02-03") == date(2026, 2, 3)
    assert from_text(1007, "{1,2}") == "{1,2}"
    with pytest.raises(ValueError, match="cannot be represented"):
        from_text(1184, "infinity")


@pytest.mark.parametrize("oid", [1082, 1114, 1184])  # date, timestamp, timestamptz
@pytest.mark.parametrize("text", ["infinity", "-infinity"])
def test_an_infinite_date_or_timestamp_says_so_in_one_line(oid: int, text: str) -> None:
    """Python's own wording ("Invalid isoformat string: 'infinity'") was the run's error."""
    kind = "date" if oid == 1082 else "timestamp"
    with pytest.raises(ValueError, match="cannot be represented") as err:
        from_text(oid, text)
    assert str(err.value) == (
        f"{kind} value {text!r} cannot be represented"
        f" (Postgres {text} has no Arrow/Python equivalent)"
    )


@pytest.mark.parametrize(
    ("oid", "text", "why"),
    [
        (1082, "0044-03-15 BC", "years BC"),
        (1184, "0044-03-15 12:00:00+00 BC", "years BC"),
        (1082, "10000-01-01", "years after 9999"),
        (1114, "10000-01-01 00:00:00", "years after 9999"),
    ],
)
def test_a_date_or_timestamp_past_pythons_years_says_so(oid: int, text: str, why: str) -> None:
    refused = f"value '{text}' cannot be represented ({why} are outside Python's date range)"
    with pytest.raises(ValueError, match=re.escape(refused)):
        from_text(oid, text)


def test_dates_and_timestamps_at_pythons_limits_still_convert() -> None:
    assert from_text(1082, "0001-01-01") == date(1, 1, 1)
    assert from_text(1082, "9999-12-31") == date(9999, 12, 31)
    last = datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert from_text(1114, "9999-12-31 23:59:59.999999") == last
    assert from_text(1184, "0001-01-01 00:00:00+00") == datetime(1, 1, 1, tzinfo=UTC)


def test_an_infinite_date_in_a_change_names_its_table_and_column() -> None:
    relation = Relation(7, "public", "d", "d", (Column("id", 20, True), Column("day", 1082, False)))
    rows = ChangeRows(("id", "day"), ["public.d"], "id")
    rows.relation(relation)
    change = Change("c", relation.relid, ("1", "-infinity"), None, None)
    with pytest.raises(CdcError) as err:
        rows.rows(change, 1, datetime(2026, 1, 1, tzinfo=UTC))
    assert str(err.value) == (
        "table public.d: column 'day': date value '-infinity' cannot be represented"
        " (Postgres -infinity has no Arrow/Python equivalent); a change of id '1' in the slot"
        " holds it (fixing the row adds a change, this one stays): take a new snapshot once no"
        " row holds such a value ('sluice cdc drop', empty the sink, discover again)"
    )


def test_bad_messages_are_one_line_errors() -> None:
    with pytest.raises(DecodeError, match="ends early"):
        decode(bytes.fromhex(CAPTURED[0])[:5])
    with pytest.raises(DecodeError, match="unknown pgoutput message"):
        decode(b"Z")


def test_a_marker_message_carries_its_lsn() -> None:
    marker = decode(bytes.fromhex("4d000000000001b73cf8736c756963650000000000"))
    assert marker == Marker(0x1B73CF8, False, "sluice")


def test_a_markers_content_is_decoded_and_a_sluice_marker_carries_the_server_time() -> None:
    content = b"1790000000123456"
    payload = (
        b"M\x00"
        + (0x1B73CF8).to_bytes(8, "big")
        + b"sluice-cdc\x00"
        + len(content).to_bytes(4, "big")
        + content
    )
    marker = decode(payload)
    assert marker == Marker(0x1B73CF8, False, "sluice-cdc", content)
    assert isinstance(marker, Marker)
    assert marker_time(marker) == datetime(2026, 9, 21, 14, 13, 20, 123456, tzinfo=UTC)
    with pytest.raises(DecodeError, match="ends early"):
        decode(payload[:-1])
    # No time: another prefix, a transactional message, an empty or a non-numeric content.
    assert marker_time(Marker(1, False, "other", content)) is None
    assert marker_time(Marker(1, True, MARKER_PREFIX, content)) is None
    assert marker_time(Marker(1, False, MARKER_PREFIX, b"")) is None
    assert marker_time(Marker(1, False, MARKER_PREFIX, b"-5")) is None


def _rows(declared: tuple[str, ...], table: str) -> list[list[object]]:
    rows = ChangeRows(declared, [table], "id")
    out: list[list[object]] = []
    lsn, at = 0, datetime(2026, 1, 1, tzinfo=UTC)
    for message in messages():
        if isinstance(message, Relation):
            rows.relation(message)
        elif isinstance(message, Begin):
            lsn, at = message.commit_lsn, message.commit_time
        elif isinstance(message, Change):
            out.extend(rows.rows(message, lsn, at))
    return out


def test_change_rows_carry_op_lsn_time_before_and_table() -> None:
    out = _rows(("id", "name"), "public.t")
    assert [(r[0], r[1], r[2], r[6]) for r in out] == [
        (1, "a", "c", "public.t"),
        (2, None, "c", "public.t"),
        (1, "b", "u", "public.t"),
        (2, None, "d", "public.t"),  # the key change: the old key goes ...
        (3, None, "u", "public.t"),  # ... and the new one comes
        (1, None, "d", "public.t"),
    ]
    assert out[0][3] == out[1][3] == 0x1AFABF0  # the commit LSN of their transaction
    assert out[0][5] is None  # an insert has no old row
    assert orjson.loads(str(out[3][5])) == {"id": 2}  # key change: the old key
    assert orjson.loads(str(out[5][5])) == {"id": 1}  # delete: the key (default identity)


def test_full_replica_identity_gives_the_old_row() -> None:
    out = _rows(("id", "v"), "public.f")
    assert [(r[0], r[1], r[2]) for r in out] == [(1, "x", "c"), (1, "y", "u"), (1, "y", "d")]
    assert orjson.loads(str(out[1][5])) == {"id": 1, "v": "x"}
    assert orjson.loads(str(out[2][5])) == {"id": 1, "v": "y"}


def test_a_declared_column_the_table_lacks_is_one_line() -> None:
    relation = next(m for m in messages() if isinstance(m, Relation) and m.table == "f")
    with pytest.raises(CdcError, match=r"table public\.f has no column 'name' any more"):
        ChangeRows(("id", "name"), ["public.f"], "id").relation(relation)


def test_an_unchanged_toasted_declared_column_without_full_identity_is_one_line() -> None:
    relation = messages()[1]
    assert isinstance(relation, Relation)
    rows = ChangeRows(("id", "name"), ["public.t"], "id")
    rows.relation(relation)
    change = Change("u", relation.relid, ("1", UNCHANGED, *([None] * 6)), None, None)
    with pytest.raises(CdcError, match="REPLICA IDENTITY FULL") as err:
        rows.rows(change, 1, datetime(2026, 1, 1, tzinfo=UTC))
    # Setting it is not enough: the changes in the slot were written without it.
    assert "'sluice cdc drop' this pipeline, empty its sink table" in str(err.value)
    assert "\n" not in str(err.value)
    # a column the pipeline does not read may stay unsent
    fine = Change(
        "u", relation.relid, ("1", "n", "1", None, None, None, UNCHANGED, None), None, None
    )
    assert rows.rows(fine, 1, datetime(2026, 1, 1, tzinfo=UTC))[0][:3] == [1, "n", "u"]
