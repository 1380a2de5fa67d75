"""How ``sluice dead-letters`` shows a listing: rich tables, or JSON for ``--json`` (every
field, for scripts).

A dead letter's raw bytes are whatever the input held — escape sequences, other encodings,
markup — so text output gets them escaped, one way back to the bytes: a byte that is not
UTF-8 as ``\\xNN``, a control character as ``\\n``, ``\\t``, ``\\r`` or ``\\xNN``, a
backslash as ``\\\\``; never interpreted (by the terminal or by rich). JSON carries the
bytes exactly (base64) beside the same escaped text.
"""

from __future__ import annotations

import base64
from datetime import date
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from enumerator_service import DeadLetterListing, ListedDeadLetter

__all__ = ["dead_letters_json", "dead_letters_view", "printable"]

#: Characters of the raw input a table row shows (the JSON has all of it).
_RAW_WIDTH = 80
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def printable(raw: bytes, width: int | None = None) -> str:
    """``raw`` as one line of text safe on a terminal (see the module docstring), cut to
    ``width`` characters with ``…`` when longer."""
    # Bytes that are not UTF-8 decode to lone surrogates U+DC80..U+DCFF (never valid text).
    text = raw.decode("utf-8", "surrogateescape")
    out: list[str] = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    line = "".join(out)
    if width is not None and len(line) > width:
        return line[: width - 1] + "…"
    return line


def _iso(day: date | None) -> str | None:
    return day.isoformat() if day is not None else None


def _day(day: date | None) -> str:
    return _iso(day) or "-"


def _none(listing: DeadLetterListing, filtered: bool) -> str:
    return f"no dead letters of {listing.source}" + (" match" if filtered else "")


def _more(listing: DeadLetterListing, limit: int) -> str | None:
    if listing.total <= len(listing.shown):
        return None
    return (
        f"showing {len(listing.shown):,} of {listing.total:,}"
        f" (--limit {min(listing.total, max(limit * 10, 100)):,} shows more;"
        " --json for every field)"
    )


def dead_letters_view(listing: DeadLetterListing, limit: int, filtered: bool) -> RenderableType:
    """A summary by day and reason, then the dead letters shown."""
    if not listing.total:
        return Text(_none(listing, filtered))
    summary = Table(
        title=f"Dead letters of {listing.source}: {listing.total:,}",
        title_justify="left",
    )
    for column in ("day", "reason", "count"):
        summary.add_column(column, justify="right" if column == "count" else "left")
    for day, category, count in listing.by_day:
        summary.add_row(_day(day), Text(printable(category.encode())), f"{count:,}")
    rows = Table(show_header=True)
    for column in ("day", "where", "reason", "raw"):
        rows.add_column(column, overflow="fold")
    for letter in listing.shown:
        rows.add_row(
            _day(letter.day),
            Text(f"{printable(letter.uri.encode())} @ {letter.offset}"),  # (file names too)
            Text(printable(letter.reason.encode())),
            Text(printable(letter.raw, _RAW_WIDTH)),
        )
    parts: list[RenderableType] = [summary, rows]
    more = _more(listing, limit)
    if more is not None:
        parts.append(Text(more))
    return Group(*parts)


def _letter_json(letter: ListedDeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "day": _iso(letter.day),
        "split_id": letter.split_id,
        "uri": letter.uri,
        "offset": letter.offset,
        "reason": letter.reason,
        "raw": printable(letter.raw),
        "raw_base64": base64.b64encode(letter.raw).decode("ascii"),
        "run_id": letter.run_id,
        "created_at": letter.created_at.isoformat(),
    }


def dead_letters_json(listing: DeadLetterListing) -> dict[str, Any]:
    return {
        "source": listing.source,
        "total": listing.total,
        "truncated": listing.total > len(listing.shown),
        "by_day": [
            {"day": _iso(day), "reason": category, "count": count}
            for day, category, count in listing.by_day
        ],
        "dead_letters": [_letter_json(letter) for letter in listing.shown],
    }
