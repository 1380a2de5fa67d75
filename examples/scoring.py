"""The scoring pipeline: orders among the web events, scored by an HTTP service.

The user's own async function (``ScoringClient``, Flink's ``AsyncFunction`` in coroutine
style) calls ``POST <url>`` once per record with ``{"event_id", "amount"}`` and adds the
service's ``score``. At most ``capacity`` requests are in flight per task; a request that
takes longer than ``timeout`` is answered by ``ScoringClient.timeout()`` — the record is kept
with ``score`` null and ``scored`` false — instead of failing the task; a dropped connection
is retried with exponential backoff. Results are emitted as they complete (``unordered``).

``examples.scoring_service`` is a local scoring service to try it with
(``python -m examples.scoring_service --port 8700``).
"""

from __future__ import annotations

from typing import Any

import httpx
import pyarrow.compute as pc

from spark_jobs import (
    AsyncMap,
    CoroutineAsyncFunction,
    FileSource,
    Filter,
    ParquetSink,
    Pipeline,
    ResultFuture,
    exponential_backoff,
)
from spark_jobs.pipeline import Duration

__all__ = ["ScoringClient", "scoring", "scoring_pipeline"]


class ScoringClient(CoroutineAsyncFunction[dict[str, Any], dict[str, Any]]):
    """One HTTP request per record, on a keep-alive connection pool of the task."""

    def __init__(self, url: str, *, connections: int = 32) -> None:
        self.url = url
        self.connections = connections
        self._client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        limits = httpx.Limits(max_connections=self.connections)
        # The step's timeout bounds a record; this only frees a connection a dead peer holds.
        self._client = httpx.AsyncClient(limits=limits, timeout=60.0)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        assert self._client is not None, "open() creates the client"
        response = await self._client.post(
            self.url, json={"event_id": value["event_id"], "amount": value["amount"]}
        )
        response.raise_for_status()
        return [{"score": float(response.json()["score"]), "scored": True}]

    def timeout(self, value: dict[str, Any], result_future: ResultFuture[dict[str, Any]]) -> None:
        # Flink's timeout(): a slow answer is not worth failing the task for.
        result_future.complete([{"score": None, "scored": False}])


def _transport_error(error: BaseException) -> bool:
    return isinstance(error, httpx.TransportError)


def scoring_pipeline(
    url: str,
    *,
    name: str = "scoring",
    landing: str = "landing/events",
    timeout: Duration = "2s",
    capacity: int = 64,
) -> Pipeline:
    """The pipeline, scoring against the service at ``url`` with ``capacity`` requests in
    flight per task (one connection each, so no request waits for a connection)."""
    return Pipeline(
        name=name,
        description="Orders among the web events, scored by an HTTP service.",
        source=FileSource(
            landing=landing,
            schema={
                "event_id": "string",
                "user_id": "int64",
                "event_time": "timestamp",
                "event_type": "string",
                "amount": "float64",
            },
            required=["event_id", "user_id", "event_time", "event_type", "amount"],
            event_time="event_time",
        ),
        steps=[
            Filter(pc.field("event_type") == "order"),
            AsyncMap(
                ScoringClient(url, connections=capacity),
                output={"score": "float64", "scored": "bool"},
                per="record",
                capacity=capacity,
                timeout=timeout,
                # A dropped connection is worth another try (the timeout spans all of them).
                retry=exponential_backoff(3, 0.05, 0.5, on_exception=_transport_error),
                mode="unordered",
            ),
        ],
        sink=ParquetSink(f"{name}_orders"),
        key=["event_id"],
    )


scoring = scoring_pipeline("http://127.0.0.1:8700/score")
