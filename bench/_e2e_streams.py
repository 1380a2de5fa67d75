"""``bench/e2e.py``: the stream sources' rows (CDC, Kafka) wired into one invocation.

``StreamRows.plans`` adds their round plans (``_e2e_cdc``, ``_e2e_kafka``; skip names ``cdc``
and ``kafka``); after the rounds, ``latencies`` runs each source's continuous latency
measurement at half its measured median rate; ``verdicts`` says how the targets went.

Threading: main thread only. The Kafka broker is entered into the caller's ``ExitStack``
(stopped with it); ``close`` shuts the Kafka ceiling's process pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from _e2e_cdc import CdcBench, cdc_verdicts
from _e2e_cdc_latency import measure_cdc_latency
from _e2e_cdc_source import CdcSource, own_server, platform_source
from _e2e_common import Context, Result, console
from _e2e_kafka import KafkaBench, KafkaTopic, kafka_topic, kafka_verdicts
from _e2e_kafka_latency import measure_kafka_latency
from _e2e_latency import Latency, latency_verdict

from enumerator_service import asyncpg_dsn

__all__ = ["StreamRows"]


class StreamRows:
    def __init__(self, ctx: Context, skip: set[str], servers: contextlib.ExitStack) -> None:
        self.ctx, self.skip = ctx, skip
        self.topic: KafkaTopic | None = None
        self.kafka: KafkaBench | None = None
        self.cdc_latency: Latency | None = None
        self.kafka_latency: Latency | None = None
        self.cdc_source: CdcSource | None = None
        if "cdc" not in skip:  # (before Spark starts: its workers inherit the URL's variable)
            self.cdc_source = servers.enter_context(own_server(ctx.platform.settings.home_path))
        if "kafka" not in skip:
            events = min(ctx.args.kafka_events, ctx.events)
            self.topic = servers.enter_context(kafka_topic(ctx, events))

    def plans(self) -> list[tuple[str, Callable[[], Result]]]:
        plans: list[tuple[str, Callable[[], Result]]] = []
        if self.cdc_source is not None:
            changes = self.ctx.args.cdc_changes
            plans += CdcBench(self.ctx, changes, self.cdc_source).plans()
            same = platform_source(self.ctx.platform)
            plans += CdcBench(self.ctx, changes, same, kinds=("apply",)).plans()
        if self.topic is not None:
            self.kafka = KafkaBench(self.ctx, self.topic, asyncpg_dsn(self.ctx.platform.url))
            plans += self.kafka.plans()
        return plans

    def close(self) -> None:
        if self.kafka is not None:
            self.kafka.close()

    def latencies(self, results: list[Result]) -> None:
        """The continuous runs, each at half its source's median rate of the rounds."""
        seconds = self.ctx.args.latency_seconds
        if seconds <= 0:
            return  # --latency-seconds 0: no continuous runs (their verdicts say "not measured")
        cdc = next((r for r in results if r.kind == "cdc-lookup"), None)
        if cdc is not None:
            with console.status("CDC latency: a continuous run at half the CDC rate…"):
                self.cdc_latency = measure_cdc_latency(self.ctx, cdc.rate / 2, seconds)
            console.print(latency_verdict(self.cdc_latency, "CDC"))
        kafka = next((r for r in results if r.kind == "kafka"), None)
        if kafka is not None and self.topic is not None:
            with console.status("Kafka latency: a continuous run at half the Kafka rate…"):
                self.kafka_latency = measure_kafka_latency(
                    self.ctx, self.topic, kafka.rate / 2, seconds
                )
            console.print(latency_verdict(self.kafka_latency, "Kafka"))

    def verdicts(self, results: list[Result]) -> list[str]:
        return [
            *cdc_verdicts(results),
            latency_verdict(self.cdc_latency, "CDC"),
            *kafka_verdicts(results),
            latency_verdict(self.kafka_latency, "Kafka"),
        ]
