"""The Kafka source end to end on real Spark against a real Kafka-protocol broker (Tansu,
started by the test): bounded "available now" runs exactly once over a 4-partition topic
with 2 subtasks (each subtask reads its own 2 partitions at once), the next run only what
was produced since, and the committed offsets back in the consumer group."""

from __future__ import annotations

import pprint
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition
from conftest import TestSettings
from dagster import DagsterInstance, materialize
from kafka_broker import (
    ClickProducer,
    KafkaBroker,
    kafka_broker,
    produce_clicks,
    producer,
    scanned_offsets,
)
from kafka_pipeline import assert_exactly_once, click_pipeline, output_rows
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from dagster_project._counts import partition_counts
from enumerator_service import (
    ConfigError,
    CrossDayRebuildError,
    SplitStore,
    StreamSplit,
    dead_letters,
    splits,
)
from enumerator_service._live_state import live_state
from enumerator_service._operations import discover, open_platform
from enumerator_service._schema import (
    checkpoint_acks,
    checkpoints,
    partition_completions,
    partition_stats,
    run_watermarks,
)
from spark_jobs._outcomes import DeterministicFailure
from spark_jobs._spark import spark_for
from spark_jobs.cli._render import kafka_lag_line
from spark_jobs.connectors.kafka import _enumerator as kafka_enumerator
from spark_jobs.connectors.kafka._client import consumer, watermarks
from spark_jobs.connectors.kafka._connector import KafkaConnector
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with kafka_broker() as running:
        yield running


def _split_rows(engine: sa.Engine, source: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(
                    splits.c.uri,
                    splits.c.start_offset,
                    splits.c.end_offset,
                    splits.c.status,
                    splits.c.subtask,
                    splits.c.committed_offset,
                )
                .where(splits.c.source == source)
                .order_by(splits.c.uri, splits.c.start_offset)
            ).all()
        )


def _lag(platform: Any, pipeline: Any) -> tuple[int, dict[str, int], int]:
    """``sluice status``'s message lag: (total, per partition, unseen partitions>0) — and
    its line renders."""
    with platform.engine.connect() as conn:
        held = KafkaConnector().source_status(conn, pipeline.plan)
    assert "kafka_unknown" not in held, held
    assert kafka_lag_line(held).startswith(f"{held['kafka_lag_messages']:,} messages on 4 ")
    return held["kafka_lag_messages"], held["kafka_lag"], int(held["kafka_partitions_unseen"] > 0)


def test_bounded_runs_read_each_message_once_and_commit_offsets_to_the_group(
    make_settings: Any, broker: KafkaBroker
) -> None:
    settings: TestSettings = make_settings(parallelism=2)
    platform = open_platform(settings)
    topic = f"clicks_{secrets.token_hex(3)}"
    name = f"kafka_{secrets.token_hex(3)}"
    broker.create_topic(topic, 4)
    try:
        oracle = produce_clicks(broker.bootstrap, topic, range(0, 2000))
        pipeline = click_pipeline(name, broker.bootstrap, topics=[topic])
        # Before any tick: 4 partitions to discover, counted from their start (earliest).
        total, per_partition, unseen = _lag(platform, pipeline)
        assert (total, len(per_partition), unseen) == (2000, 4, 1), per_partition
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 4
        assert _lag(platform, pipeline) == (2000, per_partition, 0)
        first = run_pipeline(settings, pipeline)
        assert (first.rows_out, first.dead_letters) == (2000, 0)
        assert _lag(platform, pipeline) == (0, dict.fromkeys(per_partition, 0), 0)
        rows = _split_rows(platform.engine, name)
        # 4 partitions, 2 subtasks: each read its own 2 (one consumer per subtask).
        assert sorted(r.subtask for r in rows) == [0, 0, 1, 1], rows
        assert {r.status for r in rows} == {"COMPLETED"}
        folder = output_path(pipeline, settings)
        assert_exactly_once(output_rows(folder), oracle)

        # More messages; the next bounded run reads exactly those.
        oracle |= produce_clicks(broker.bootstrap, topic, range(2000, 3000))
        # Two malformed messages: dead letters, counted on their Kafka timestamp's day (the
        # main line has no landing day), so the day's dead_letter_ratio sees them.
        sender = producer(broker.bootstrap)
        stamp = int(datetime(2026, 5, 2, 12, tzinfo=UTC).timestamp() * 1000)
        sender.produce(topic, b"{oops", key=b"k1", partition=1, timestamp=stamp)
        sender.produce(topic, b"\xff", key=b"k2", partition=3, timestamp=stamp)
        assert sender.flush(10) == 0
        # The lag counts what was produced since, before any tick (from the positions).
        assert _lag(platform, pipeline)[0] == 1002
        discover(platform, discovery_of(pipeline, settings))
        assert _lag(platform, pipeline)[0] == 1002
        second = run_pipeline(settings, pipeline)
        assert (second.rows_out, second.dead_letters) == (1000, 2)
        assert _lag(platform, pipeline)[0] == 0
        assert_exactly_once(output_rows(folder), oracle)
        with platform.engine.connect() as conn:
            letters = conn.execute(
                sa.select(dead_letters.c.uri, dead_letters.c.offset, dead_letters.c.reason)
                .where(dead_letters.c.source == name)
                .order_by(dead_letters.c.uri)
            ).all()
            tagged = conn.execute(
                sa.select(dead_letters.c.partition_key).where(dead_letters.c.source == name)
            ).scalars()
            per_day = dict(
                conn.execute(
                    sa.select(
                        partition_stats.c.partition_key, partition_stats.c.dead_letters
                    ).where(partition_stats.c.source == name)
                ).all()
            )
        assert list(tagged) == [date(2026, 5, 2)] * 2
        assert per_day[date(2026, 5, 2)] == 2 and sum(per_day.values()) == 2, per_day
        # ... and the Dagster dead_letter_ratio check of that day counts them.
        (may_2,) = partition_counts(pipeline, settings, [date(2026, 5, 2)])
        assert may_2.dead_letters == 2 and may_2.rows_committed == 1000, may_2
        ends = {r.uri: r.end_offset for r in _split_rows(platform.engine, name)}
        assert [(u, o) for u, o, _ in letters] == [
            (f"{topic}/1", ends[f"{topic}/1"] - 1),  # the last message of each
            (f"{topic}/3", ends[f"{topic}/3"] - 1),
        ]
        assert letters[0].reason.startswith("invalid JSON") and "(key 'k1')" in letters[0].reason
        assert letters[1].reason == "invalid UTF-8: the message is not valid UTF-8 text (key 'k2')"
        # Nothing new: a third run reads nothing.
        discover(platform, discovery_of(pipeline, settings))
        assert run_pipeline(settings, pipeline).rows_out == 0

        # The group holds the committed offsets: each partition's end.
        options = pipeline.plan.source.options
        client = consumer(options)
        try:
            ends = watermarks(client, options, [(topic, p) for p in range(4)])
            group = client.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
        finally:
            client.close()
        assert options.group_id == f"sluice-{name}"
        assert {tp.partition: tp.offset for tp in group} == {
            p: ends[(topic, p)][1] for p in range(4)
        }
        assert sum(end for _, end in ends.values()) == 3002
    finally:
        broker.delete_topic(topic)
        platform.close()


def _completions(platform: Any, source: str) -> dict[date, int]:
    """Completion generations per output day of ``source``."""
    with platform.engine.connect() as conn:
        rows = conn.execute(
            sa.select(partition_completions.c.partition_key, sa.func.count())
            .where(partition_completions.c.source == source)
            .group_by(partition_completions.c.partition_key)
        ).all()
    return {row.partition_key: int(row[1]) for row in rows}


def _live(platform: Any, run_id: str, source: str) -> Any:
    """For a failure: the run's watermark row, the source's splits (uri, status, run,
    partition key, watermark), its partition stats and the run's last checkpoints."""
    with platform.engine.connect() as conn:
        mark = conn.execute(
            sa.select(run_watermarks).where(run_watermarks.c.run_id == run_id)
        ).first()
        held = conn.execute(
            sa.select(
                splits.c.uri,
                splits.c.status,
                splits.c.run_id,
                splits.c.partition_key,
                splits.c.committed_watermark,
            ).where(splits.c.source == source)
        ).all()
        stats = conn.execute(
            sa.select(partition_stats).where(partition_stats.c.source == source)
        ).all()
        last = conn.execute(
            sa.select(checkpoints.c.checkpoint_id, checkpoints.c.status, checkpoints.c.completed_at)
            .where(checkpoints.c.run_id == run_id)
            .order_by(checkpoints.c.checkpoint_id.desc())
            .limit(3)
        ).all()
        acks = conn.execute(
            sa.select(checkpoint_acks.c.subtask, checkpoint_acks.c.snapshot).where(
                checkpoint_acks.c.run_id == run_id,
                checkpoint_acks.c.checkpoint_id == (last[0].checkpoint_id if last else -1),
            )
        ).all()
    return mark, held, stats, last, acks


class _Feeder:
    """What the continuous sensor does: discovery ticks, new splits assigned to the live
    run (here every ``interval`` seconds, from a thread of its own)."""

    def __init__(self, platform: Any, pipeline: Any, settings: Any, run_id: str) -> None:
        self._args = (platform, pipeline, settings, run_id)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        platform, pipeline, settings, run_id = self._args
        store = SplitStore(platform.engine)
        try:
            while not self._stop.wait(0.3):
                discover(platform, discovery_of(pipeline, settings))
                store.assign_to_run(run_id, pipeline.name, lease_seconds=settings.lease_seconds)
        except BaseException as exc:  # shown by the test
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_bounded_run_leaves_the_day_it_stopped_in_open_for_the_next_run(
    make_settings: Any, broker: KafkaBroker
) -> None:
    """A scheduled ("available now") run's end is not the end of the topic: the day it
    stopped in completes only once a later run's records pass its end — with
    late_records="dead_letter", the trial's second run sent all 200 records of the current
    day to the dead letters (the first run had completed the day)."""
    settings: TestSettings = make_settings(parallelism=2)
    platform = open_platform(settings)
    topic = f"open_{secrets.token_hex(3)}"
    name = f"kafka_{secrets.token_hex(3)}"
    broker.create_topic(topic, 2)
    # 1,000 a day from 2026-05-01 00:00: events 0..299 are 05-01's first 7.2 hours.
    pipeline = click_pipeline(name, broker.bootstrap, topics=topic, late_records="dead_letter")
    try:
        oracle = produce_clicks(broker.bootstrap, topic, range(0, 300))
        discover(platform, discovery_of(pipeline, settings))
        assert (run_pipeline(settings, pipeline).rows_out, _completions(platform, name)) == (
            300,
            {},
        )
        oracle |= produce_clicks(broker.bootstrap, topic, range(300, 600))  # the same day
        discover(platform, discovery_of(pipeline, settings))
        second = run_pipeline(settings, pipeline)
        assert (second.rows_out, second.dead_letters) == (300, 0)  # none late
        assert _completions(platform, name) == {}
        # Records of 05-02 pass 05-01's end (+1 s out of order): 05-01 completes, once.
        oracle |= produce_clicks(broker.bootstrap, topic, range(1000, 1100))
        discover(platform, discovery_of(pipeline, settings))
        assert run_pipeline(settings, pipeline).rows_out == 100
        assert _completions(platform, name) == {date(2026, 5, 1): 1}
        assert_exactly_once(output_rows(output_path(pipeline, settings)), oracle)
    finally:
        broker.delete_topic(topic)
        platform.close()


def test_a_continuous_run_reads_while_messages_arrive_and_finds_new_topics(
    make_settings: Any, broker: KafkaBroker
) -> None:
    settings: TestSettings = make_settings(
        parallelism=2,
        checkpoint_interval_seconds=0.5,
        continuous_poll_seconds=0.3,
        continuous_idle_seconds=300,
    )
    platform = open_platform(settings)
    prefix = f"ct_{secrets.token_hex(3)}"
    name = f"kafka_{secrets.token_hex(3)}"
    first, later = f"{prefix}_a", f"{prefix}_b"
    broker.create_topic(first, 4)
    pipeline = click_pipeline(name, broker.bootstrap, pattern=f"{prefix}_.*", idle_timeout="5s")
    folder = output_path(pipeline, settings)
    run_id = f"{name}-live"
    oracle: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {}

    def reader() -> None:
        try:
            result["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # shown by the test
            result["error"] = exc

    def wait_for(events: set[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not events <= {r["event_id"] for r in output_rows(folder)}:
            assert run.is_alive(), result
            assert feeder.error is None, feeder.error
            assert time.monotonic() < deadline, "the continuous run did not read them in time"
            time.sleep(0.3)

    discover(platform, discovery_of(pipeline, settings))
    run = threading.Thread(target=reader, daemon=True)
    feeder = _Feeder(platform, pipeline, settings, run_id)
    clicks = ClickProducer(broker.bootstrap, first, limit=3000)  # ~3 s while the run reads
    try:
        run.start()
        clicks.start()
        wait_for({"e-00000000"}, 150)  # Spark is up and reading
        # A topic created while the run lives (the pattern matches it): found and read.
        broker.create_topic(later, 2)
        # (Its events are of 05-03, a day still open: none can be late.)
        oracle |= produce_clicks(broker.bootstrap, later, range(2000, 2500), prefix="b")
        # The producer runs to its limit (days 05-01 to 05-03 of the first topic): stopped
        # early under load, it left 05-02 without events, a day that then never completes.
        clicks.join(120)
        oracle |= clicks.stop()
        assert len(oracle) == 3500, len(oracle)
        wait_for(set(oracle), 60)
        # Per-partition watermarks with idleness: every partition is quiet now; idle after
        # 5 s, they stop holding the run back (all idle: the greatest watermark reached), so
        # 05-01 and 05-02 complete while the run lives, once each (05-03 is still open:
        # the run watermark is its last event's time).
        deadline = time.monotonic() + 30
        while not {date(2026, 5, 1), date(2026, 5, 2)} <= set(_completions(platform, name)):
            # The watermark row is read first: a completion commits with its watermark, so
            # completions read after it include every one that watermark made.
            live = _live(platform, run_id, name)
            assert run.is_alive() and time.monotonic() < deadline, pprint.pformat(
                (result, _completions(platform, name), live), width=160
            )
            time.sleep(0.3)
        assert _completions(platform, name) == {date(2026, 5, 1): 1, date(2026, 5, 2): 1}
        with platform.engine.connect() as conn:
            live = conn.execute(
                sa.select(splits.c.uri, splits.c.subtask).where(
                    splits.c.source == name, splits.c.end_offset.is_(None)
                )
            ).all()
        # Six open splits, three per subtask, read at once.
        assert len(live) == 6 and sorted(s for _, s in live) == [0, 0, 0, 1, 1, 1], live
    finally:
        feeder.stop()
        # Cancelled, as Dagster cancels a continuous run.
        spark_for(settings).sparkContext.cancelAllJobs()
        run.join(60)
    assert not run.is_alive()
    rows = output_rows(folder)
    assert_exactly_once(rows, oracle)
    # More messages after the continuous run stopped: a bounded run continues the open
    # splits from their committed offsets and reads exactly those.
    oracle |= produce_clicks(broker.bootstrap, first, range(3000, 3400))
    discover(platform, discovery_of(pipeline, settings))
    after = run_pipeline(settings, pipeline)
    assert after.rows_out == 400
    assert_exactly_once(output_rows(folder), oracle)
    platform.close()


def test_a_day_is_backfilled_by_time_range_and_rebuilt_from_its_day_splits_alone(
    make_settings: Any, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tansu answers offsets_for_times with 0: the real answer, found by reading.
    monkeypatch.setattr(kafka_enumerator, "timestamp_offsets", scanned_offsets)
    settings: TestSettings = make_settings(parallelism=2)
    platform = open_platform(settings)
    topic = f"days_{secrets.token_hex(3)}"
    broker.create_topic(topic, 4)
    days = [date(2026, 5, 1), date(2026, 5, 2), date(2026, 5, 3)]
    # Three days of 300 events; each message's Kafka timestamp is its event time.
    oracle = produce_clicks(broker.bootstrap, topic, range(900), per_day=300, timestamps=True)

    def of_day(day: date) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in oracle.items() if v["ts"].startswith(day.isoformat())}

    def completions(source: str) -> dict[date, int]:
        return _completions(platform, source)

    try:
        # A pipeline that never read the topic backfills day 2 alone: exactly its events.
        backfill = click_pipeline(f"kafka_{secrets.token_hex(3)}", broker.bootstrap, topics=topic)
        registered = discover(platform, discovery_of(backfill, settings), dates=[days[1]])
        assert registered.splits_registered == 4  # a day split per partition
        assert registered.notes == ()
        again = discover(platform, discovery_of(backfill, settings), dates=[days[1]])
        assert again.splits_registered == 0
        assert again.notes == (
            "4 day split(s) were registered before (a run of that day reads them once; "
            "`sluice run --date D --replace` rebuilds the day)",
        )
        day_run = run_pipeline(settings, backfill, dates=[days[1]])
        assert day_run.rows_out == 300
        assert_exactly_once(output_rows(output_path(backfill, settings)), of_day(days[1]))
        assert completions(backfill.name) == {days[1]: 1}

        # The main line reads everything; then day 2 is re-materialised by time range: its
        # day splits alone are read (not the main line's), and replace the day's output.
        name = f"kafka_{secrets.token_hex(3)}"
        pipeline = click_pipeline(name, broker.bootstrap, topics=topic)
        discover(platform, discovery_of(pipeline, settings))
        assert run_pipeline(settings, pipeline).rows_out == 900
        folder = output_path(pipeline, settings)
        assert_exactly_once(output_rows(folder), oracle)
        # Each day the main line passed complete once; day 3, where it stopped, stays open
        # for the stream's next records.
        assert completions(name) == {days[0]: 1, days[1]: 1}
        main_line = _split_rows(platform.engine, name)
        discover(platform, discovery_of(pipeline, settings), dates=[days[1]])
        rebuilt = run_pipeline(settings, pipeline, dates=[days[1]], rebuild=True)
        assert rebuilt.rows_out == 300
        assert_exactly_once(output_rows(folder), oracle)
        rows = _split_rows(platform.engine, name)
        assert [r for r in rows if "@" not in r.uri] == main_line  # not re-read
        assert {r.status for r in rows if "@" in r.uri} == {"COMPLETED"}
        # Day 2 completes again as a new generation (Dagster re-reports it), once.
        assert completions(name) == {days[0]: 1, days[1]: 2}
        # A stream has no end: the output is current as of what the main line reached (day
        # 3), not "end of input", and the day-2 rebuild read since does not lower it.
        with platform.engine.connect() as conn:
            live = live_state(conn, name, datetime.now(UTC))
        assert live.watermark is not None, live
        assert datetime(2026, 5, 3, tzinfo=UTC) <= live.watermark < datetime(2026, 5, 4, tzinfo=UTC)
        # (above the rebuild's own, the end of day 2: a backfill does not lower it)
        assert live.watermark > datetime(2026, 5, 3, tzinfo=UTC), live
    finally:
        broker.delete_topic(topic)
        platform.close()


def test_a_day_rebuild_whose_day_splits_miss_the_committed_offsets_is_refused(
    make_settings: Any, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker resolves the day to an empty range (Tansu answers 0 for both bounds; a real
    # broker after retention, or with producer timestamps that are not event time): a
    # replacement of a day with committed rows would swap them for none. Refused, one line.
    settings: TestSettings = make_settings(parallelism=2)
    platform = open_platform(settings)
    topic = f"miss_{secrets.token_hex(3)}"
    broker.create_topic(topic, 2)
    days = [date(2026, 5, 1), date(2026, 5, 2)]
    oracle = produce_clicks(broker.bootstrap, topic, range(200), per_day=100, timestamps=True)
    name = f"kafka_{secrets.token_hex(3)}"
    pipeline = click_pipeline(name, broker.bootstrap, topics=topic)
    folder = output_path(pipeline, settings)

    def empty(_c: Any, _o: Any, marks: dict[Any, tuple[int, int]], _m: int) -> dict[Any, int]:
        return {tp: low for tp, (low, _high) in marks.items()}

    try:
        discover(platform, discovery_of(pipeline, settings))
        assert run_pipeline(settings, pipeline).rows_out == 200
        assert_exactly_once(output_rows(folder), oracle)
        before = _completions(platform, name)
        # Day 1 complete (it may complete twice: late records); day 2, where the main line
        # stopped, stays open for the stream's next records.
        assert set(before) == {days[0]}
        # Every day range empty: no day split at all.
        monkeypatch.setattr(kafka_enumerator, "timestamp_offsets", empty)
        nothing = discover(platform, discovery_of(pipeline, settings), dates=[days[1]])
        assert nothing.splits_registered == 0
        # ... and says why (printed by `sluice discover --date`).
        assert nothing.notes == (
            "2026-05-02: 2 of 2 partition(s) have no message with a timestamp in "
            "2026-05-01 23:59:59 .. 2026-05-03 00:00:01 UTC (the broker's offsets_for_times)",
        )
        with pytest.raises(CrossDayRebuildError, match=rf"{topic}/\d offsets .* cover none") as e:
            run_pipeline(settings, pipeline, dates=[days[1]], rebuild=True)
        assert "\n" not in str(e.value)

        # One partition's range misses the day (partition 0 empty): refused naming it.
        def partial(c: Any, o: Any, marks: dict[Any, tuple[int, int]], m: int) -> dict[Any, int]:
            out = scanned_offsets(c, o, marks, m)
            out[(topic, 0)] = marks[(topic, 0)][0]
            return out

        monkeypatch.setattr(kafka_enumerator, "timestamp_offsets", partial)
        assert (
            discover(platform, discovery_of(pipeline, settings), dates=[days[1]]).splits_registered
            == 1
        )
        with pytest.raises(CrossDayRebuildError, match=rf"{topic}/0 offsets .* cover none"):
            run_pipeline(settings, pipeline, dates=[days[1]], rebuild=True)
        # Nothing replaced: the committed rows are all there, no new generation.
        assert_exactly_once(output_rows(folder), oracle)
        assert _completions(platform, name) == before
    finally:
        broker.delete_topic(topic)
        platform.close()


def test_a_dagster_day_partition_of_a_kafka_pipeline_is_its_time_range_once(
    make_settings: Any, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(kafka_enumerator, "timestamp_offsets", scanned_offsets)  # (Tansu)
    settings: TestSettings = make_settings(parallelism=2, checkpoint_interval_seconds=1.0)
    topic = f"dg_{secrets.token_hex(3)}"
    broker.create_topic(topic, 4)
    days = [date(2026, 5, 1), date(2026, 5, 2)]
    oracle = produce_clicks(broker.bootstrap, topic, range(400), per_day=200, timestamps=True)
    name = f"kafka_{secrets.token_hex(3)}"
    pipeline = click_pipeline(name, broker.bootstrap, topics=topic, start_date=days[0])
    built = pipeline_definitions(pipeline, settings)
    assert built.output.partitions_def is not None
    (tmp_path / "dagster").mkdir()
    platform = open_platform(settings)
    try:
        with DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
            for _ in range(2):  # a second materialisation replaces the day, exactly
                result = materialize(
                    [built.output, *built.checks],
                    partition_key=days[1].isoformat(),
                    resources={"sluice": resource_for(settings)},
                    instance=instance,
                )
                assert result.success
                events = result.asset_materializations_for_node(name)
                assert [e.partition for e in events] == [days[1].isoformat()]
                checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
                assert all(checks.values()), checks
                day_two = {k: v for k, v in oracle.items() if v["ts"].startswith("2026-05-02")}
                assert_exactly_once(output_rows(output_path(pipeline, settings)), day_two)
        # Only day 2 was read (its day splits); it completed once per materialisation.
        assert _completions(platform, name) == {days[1]: 2}
        assert {r.uri.partition("@")[2] for r in _split_rows(platform.engine, name)} == {
            days[1].isoformat()
        }
    finally:
        broker.delete_topic(topic)
        platform.close()


def test_a_partition_gone_mid_run_stops_the_run_in_one_line(
    make_settings: Any, broker: KafkaBroker
) -> None:
    # A partition that is no longer there while a run reads it (its topic deleted, or
    # created again with fewer partitions): the subtask's metadata check finds it and the
    # run stops at once with one line — no Spark retry, nothing committed past it. (Deleting
    # a topic a librdkafka consumer is assigned crashes it against Tansu, so the vanished
    # partition is a split registered for partition 5 of a 2-partition topic.)
    settings: TestSettings = make_settings(
        parallelism=1, checkpoint_interval_seconds=0.5, continuous_idle_seconds=300
    )
    platform = open_platform(settings)
    topic = f"gone_{secrets.token_hex(3)}"
    broker.create_topic(topic, 2)
    name = f"kafka_{secrets.token_hex(3)}"
    pipeline = click_pipeline(name, broker.bootstrap, topics=topic)
    try:
        produce_clicks(broker.bootstrap, topic, range(100))
        discover(platform, discovery_of(pipeline, settings))
        SplitStore(platform.engine).register([StreamSplit(name, "kafka", f"{topic}/5", 0, None)])
        # A bounded run refuses it before anything starts.
        with pytest.raises(ConfigError, match=rf"^KafkaSource\(topics\): partition {topic}/5 no"):
            run_pipeline(settings, pipeline)
        # A continuous run (which leaves open splits open) stops when it finds it gone.
        started = time.monotonic()
        with pytest.raises(
            DeterministicFailure, match=rf"partition {topic}/5 no longer exists"
        ) as e:
            run_pipeline(settings, pipeline, continuous=True)
        assert "\n" not in str(e.value) and time.monotonic() - started < 90
    finally:
        broker.delete_topic(topic)
        platform.close()


def test_main_line_dead_letters_count_on_their_timestamps_day_and_a_rebuild_replaces_them(
    make_settings: Any, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message the main line could not decode counts on its Kafka timestamp's day (the
    day's counts and its Dagster check see it); a rebuild of that day re-reads it from the
    day splits and replaces the main line's dead letter: one dead letter, counted once."""
    monkeypatch.setattr(kafka_enumerator, "timestamp_offsets", scanned_offsets)
    settings: TestSettings = make_settings(parallelism=2)
    platform = open_platform(settings)
    topic = f"bad_{secrets.token_hex(3)}"
    broker.create_topic(topic, 2)
    day_one = date(2026, 5, 1)
    sender = producer(broker.bootstrap)  # first in its partition, timestamped in day 1
    stamp = int(datetime(2026, 5, 1, 0, 0, 1, tzinfo=UTC).timestamp() * 1000)
    sender.produce(topic, b"not json", key=b"k0", partition=0, timestamp=stamp)
    assert sender.flush(10) == 0
    oracle = produce_clicks(broker.bootstrap, topic, range(600), per_day=300, timestamps=True)
    name = f"kafka_{secrets.token_hex(3)}"
    pipeline = click_pipeline(name, broker.bootstrap, topics=topic)

    def day_one_letters() -> list[Any]:
        with platform.engine.connect() as conn:
            return list(
                conn.execute(
                    sa.select(dead_letters.c.uri, dead_letters.c.offset)
                    .where(dead_letters.c.source == name)
                    .where(dead_letters.c.partition_key == day_one)
                ).all()
            )

    def day_one_stats() -> int:
        with platform.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(partition_stats.c.dead_letters).where(
                        partition_stats.c.source == name,
                        partition_stats.c.partition_key == day_one,
                    )
                ).scalar_one()
            )

    try:
        discover(platform, discovery_of(pipeline, settings))
        first = run_pipeline(settings, pipeline)
        assert (first.rows_out, first.dead_letters) == (600, 1)
        assert day_one_letters() == [(f"{topic}/0", 0)]
        assert day_one_stats() == 1
        assert partition_counts(pipeline, settings, [day_one])[0].dead_letters == 1
        # Day 1 rebuilt from its day splits: their dead letter replaces the main line's.
        discover(platform, discovery_of(pipeline, settings), dates=[day_one])
        rebuilt = run_pipeline(settings, pipeline, dates=[day_one], rebuild=True)
        assert (rebuilt.rows_out, rebuilt.dead_letters) == (300, 1)
        assert_exactly_once(output_rows(output_path(pipeline, settings)), oracle)
        assert day_one_letters() == [(f"{topic}/0@{day_one.isoformat()}", 0)]
        assert day_one_stats() == 1
        assert partition_counts(pipeline, settings, [day_one])[0].dead_letters == 1
    finally:
        broker.delete_topic(topic)
        platform.close()
