"""The CLI's tables print users' names, patterns and reasons literally (no rich markup)."""

from __future__ import annotations

import pytest
from rich.console import Console

from spark_jobs import ParquetSink, Pipeline
from spark_jobs.cli._render import describe_table, kafka_lag_line
from spark_jobs.connectors.kafka import KafkaSource


def test_a_topic_pattern_with_brackets_is_shown_as_written() -> None:
    pipeline = Pipeline(
        name="payments",
        source=KafkaSource(
            bootstrap="127.0.0.1:9",
            pattern="payments(-[a-z]+)?",
            schema={"payment_id": "string", "paid_at": "timestamp"},
            event_time="paid_at",
        ),
        sink=ParquetSink("payments"),
    )
    console = Console(record=True, width=200)
    console.print(describe_table(pipeline, None, None, None))
    assert "'payments(-[a-z]+)?'" in console.export_text()


def test_a_run_whose_every_record_is_a_dead_letter_says_so() -> None:
    from spark_jobs.cli._render import left_lines
    from spark_jobs.jobs import RunSummary

    def summary(rows_out: int, dead: int, dropped: int = 0) -> RunSummary:
        return RunSummary(
            "payments", "r", 2, dead + rows_out, rows_out, dead, 0, 1.0, 1.0, False,
            dropped=dropped,
        )  # fmt: skip

    (line,) = left_lines(summary(0, 1200))
    assert line.startswith("no row written: every record read went to the dead letters (1,200)")
    assert left_lines(summary(5, 1200)) == []  # some rows: the dead letters are ordinary
    assert left_lines(summary(0, 3, dropped=7)) == []  # a filter removed the rest
    assert left_lines(summary(0, 0)) == []


def test_a_watermark_ahead_of_the_clock_is_not_a_negative_lag() -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from spark_jobs.cli._render import _watermark_line

    at = datetime(2026, 11, 28, 23, 53, 23, tzinfo=UTC)
    ahead = SimpleNamespace(watermark=at, watermark_lag_seconds=-142_690.0)
    assert _watermark_line(ahead) == "2026-11-28 23:53:23 (39h 38m ahead of this clock)"  # type: ignore[arg-type]
    behind = SimpleNamespace(watermark=at, watermark_lag_seconds=61.0)
    assert _watermark_line(behind) == "2026-11-28 23:53:23 (lag 61s)"  # type: ignore[arg-type]


def test_splits_a_bounded_run_gave_back_unread_make_it_exit_4_with_a_line() -> None:
    from spark_jobs._outcomes import ExitCode
    from spark_jobs.cli._render import left_lines
    from spark_jobs.jobs import RunSummary
    from spark_jobs.jobs._input_left import InputLeft

    done = RunSummary("clicks", "r", 2, 10, 10, 0, 0, 1.0, 1.0, False)
    assert done.exit_code is ExitCode.OK and left_lines(done) == []
    short = RunSummary(
        "clicks", "r", 2, 10, 10, 0, 0, 1.0, 1.0, False, left=InputLeft(returned=3)
    )  # fmt: skip
    assert short.exit_code is ExitCode.HELD
    (line,) = left_lines(short)
    assert line.startswith("3 split(s) assigned to this run were not read although its subtasks")


def test_the_cache_row_says_no_cache_apart_from_a_cache_that_never_hit() -> None:
    from spark_jobs.cli._render import _cache_hits
    from spark_jobs.jobs import RunSummary

    def summary(keys: int, hits: float, bypassed: float) -> RunSummary:
        return RunSummary(
            "payments", "r", 2, 10, 10, 0, 0, 1.0, 1.0, False,
            cache_keys=keys, cache_hit_rate=hits, cache_bypass_rate=bypassed,
        )  # fmt: skip

    assert _cache_hits(summary(0, 0.0, 0.0)) == "— (no cache)"
    assert _cache_hits(summary(5_000, 0.0, 0.0)) == (
        "0.0% of the keys asked; 0.0% of all keys bypassed it (min_hit_rate)"
    )
    assert _cache_hits(summary(5_000, 0.515, 0.25)).startswith("51.5% of the keys asked; 25.0%")


def test_lookup_totals_count_the_keys_that_met_a_cache() -> None:
    from types import SimpleNamespace

    from spark_jobs.jobs._results import lookup_totals

    def step(hits: int, misses: int, bypassed: int) -> SimpleNamespace:
        lookup = SimpleNamespace(
            lookups=100, batches=2, cache_hits=hits, cache_misses=misses,
            cache_bypassed=bypassed, p50_ms=1.0, p99_ms=2.0,
        )  # fmt: skip
        return SimpleNamespace(lookup=lookup)

    uncached = lookup_totals([SimpleNamespace(steps=(step(0, 0, 0),))])  # type: ignore[list-item]
    assert (uncached.cache_keys, uncached.cache_hit_rate) == (0, 0.0)
    cached = lookup_totals([SimpleNamespace(steps=(step(30, 10, 60),))])  # type: ignore[list-item]
    assert (cached.cache_keys, cached.cache_hit_rate, cached.cache_bypass_rate) == (100, 0.75, 0.6)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0s"),
        (61.4, "61s"),
        (99, "99s"),
        (100, "1m 40s"),
        (3599, "59m 59s"),
        (7_200, "2h 00m"),
        (172_799, "47h 59m"),
        (18_174_081, "210d 08h"),
    ],
)
def test_durations_read_as_a_person_reads_them(seconds: float, words: str) -> None:
    from spark_jobs.cli._render import duration_words

    assert duration_words(seconds) == words


def test_the_kafka_message_lag_names_the_partitions_most_behind() -> None:
    held = {
        "kafka_lag_messages": 1_311,
        "kafka_lag": {"clicks/0": 104, "clicks/1": 0, "clicks/2": 1_100, "c/3": 5, "c/4": 102},
        "kafka_partitions": 6,
        "kafka_partitions_unseen": 1,
    }
    assert kafka_lag_line(held) == (
        "1,311 messages on 6 partitions (clicks/2 1,100, clicks/0 104, c/4 102, 1 more);"
        " 1 not discovered yet (counted from where discovery starts them)"
    )
    caught_up = {"kafka_lag_messages": 0, "kafka_lag": {"t/0": 0}, "kafka_partitions": 1}
    assert kafka_lag_line(caught_up) == "0 messages on 1 partition"


def test_the_backlog_shows_before_the_first_run() -> None:
    """Trial H: after the first discovery the status had no backlog row (only --json said 3)."""
    from datetime import UTC, datetime, timedelta

    from enumerator_service._live_state import LiveState
    from enumerator_service._operations import PlatformStatus
    from spark_jobs.cli._render import status_table

    now = datetime(2026, 11, 28, 12, tzinfo=UTC)
    live = LiveState(
        "payments", now, None, None, None, None, None, 3, now - timedelta(minutes=2), None
    )
    status = PlatformStatus("payments", {}, 0, 0, 0, [], None, None, live=live)
    console = Console(record=True, width=200)
    console.print(status_table(status, {}))
    text = console.export_text()
    assert "backlog" in text and "3 splits, oldest waiting 2m 00s" in text, text
    assert "watermark" not in text and "throughput" not in text, text
