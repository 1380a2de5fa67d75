"""``sluice dead-letters``' rendering: raw input shown escaped, never interpreted."""

from __future__ import annotations

import base64
import io
from datetime import UTC, date, datetime

from rich.console import Console

from enumerator_service import DeadLetterListing, ListedDeadLetter
from spark_jobs.cli._render_dead_letters import dead_letters_json, dead_letters_view, printable


def test_printable_escapes_controls_and_bytes_that_are_not_utf8() -> None:
    assert printable(b"plain text \xc3\xa9") == "plain text é"
    assert printable(b"a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert printable(b"\x1b[31mred\x07\x7f") == "\\x1b[31mred\\x07\\x7f"
    assert printable("\u0085".encode()) == "\\x85"  # (a C1 control, valid UTF-8)
    assert printable(b"\xff\xfeok") == "\\xff\\xfeok"
    # A backslash is escaped too: the text "\xff" and the byte 0xff never look alike.
    assert printable(b"C:\\tmp") == "C:\\\\tmp"
    assert printable(b"\\xff") != printable(b"\xff")
    assert printable(b"x" * 10, 5) == "xxxx…"
    assert printable(b"x" * 5, 5) == "xxxxx"


def _listing(raw: bytes) -> DeadLetterListing:
    letter = ListedDeadLetter(
        7, date(2026, 3, 1), 3, "/landing/dt=2026-03-01/a\x1b[2J.jsonl", 120,
        "invalid JSON: [red]x", raw, "run-1", datetime(2026, 3, 1, tzinfo=UTC),
    )  # fmt: skip
    return DeadLetterListing("events", 2, [(date(2026, 3, 1), "invalid JSON", 2)], [letter])


def test_the_view_prints_markup_literally_and_says_what_it_left_out() -> None:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        dead_letters_view(_listing(b"[bold]\x1b]0;title\x07"), limit=1, filtered=False)
    )
    text = out.getvalue()
    assert "[bold]\\x1b]0;title\\x07" in text and "\x1b" not in text
    assert "invalid JSON: [red]x" in text
    assert "a\\x1b[2J.jsonl @ 120" in text  # a file name is escaped too
    assert "showing 1 of 2" in text


def test_json_carries_the_exact_bytes() -> None:
    raw = b"\xff\x00\x1b tail"
    data = dead_letters_json(_listing(raw))
    assert base64.b64decode(data["dead_letters"][0]["raw_base64"]) == raw
    assert data["by_day"] == [{"day": "2026-03-01", "reason": "invalid JSON", "count": 2}]
    assert data["total"] == 2 and data["truncated"] is True


def test_an_empty_listing_says_whether_filters_chose_nothing() -> None:
    empty = DeadLetterListing("events", 0, [], [])
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    console.print(dead_letters_view(empty, limit=20, filtered=False))
    console.print(dead_letters_view(empty, limit=20, filtered=True))
    assert out.getvalue().splitlines() == [
        "no dead letters of events",
        "no dead letters of events match",
    ]
