"""Issue 22, files anywhere: a file source whose landing is ``s3://bucket/prefix`` on a real
S3-protocol server (moto on 127.0.0.1, ``tests/s3_server.py``), read through pyarrow's S3
client by real local Spark executors, with the platform state in real Postgres.

One pipeline run over every format (JSON Lines cut into byte ranges, CSV, gzip, Parquet) and
odd keys gives the oracle's events exactly once; an object replaced after discovery is
refused (quarantined with what changed), one deleted is the file-gone rule; after the fix,
``retry`` and a second run read them as they are then. The bad inputs (unreachable endpoint,
wrong credentials, no such bucket, unsupported scheme) are one line each naming the URI or
the setting, and leave nothing registered.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import pickle
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import TestSettings
from demo_platform import demo_pipeline, prepare_demo
from s3_server import SECRET_KEY, S3Server, s3_server

from enumerator_service import ConfigError, SplitStore
from enumerator_service._file_identity import FileChangedError
from enumerator_service._file_versions import _row_group_ranges
from enumerator_service._object_landing import READ_BYTES, ObjectLanding, StorageError
from enumerator_service._operations import discover, open_platform
from enumerator_service._quarantine import quarantined, retry_splits
from enumerator_service._storage import StorageOptions, open_location
from spark_jobs import FileSource
from spark_jobs._spark import spark_for
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

MakeSettings = Callable[..., TestSettings]
DAY = "2026-01-01"
FIELDS = ["event_id", "user_id", "event_time", "event_type", "amount"]


def _events(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{prefix}-{i}",
            "user_id": i % 50 + 1,
            "event_time": f"{DAY}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
            "event_type": "click",
            "amount": 1.5,
        }
        for i in range(n)
    ]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _csv(rows: list[dict[str, Any]]) -> bytes:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    sink = io.BytesIO()
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, sink, row_group_size=500, compression="none", use_dictionary=False)
    return sink.getvalue()


def _ids(*groups: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(r["event_id"]) for rows in groups for r in rows)


def _closed_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _plan_with_landing(pipeline: Pipeline, uri: str) -> Any:
    source = dataclasses.replace(pipeline.source, landing=uri)
    return dataclasses.replace(pipeline, source=source).plan


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


class Landing:
    """A test's bucket, its demo pipeline reading ``s3://<bucket>/events`` and its platform."""

    def __init__(self, s3: S3Server, settings: TestSettings) -> None:
        self.s3, self.settings = s3, settings
        self.bucket = f"sluice-{secrets.token_hex(4)}"
        s3.create_bucket(self.bucket)
        self.uri = f"s3://{self.bucket}/events"
        self.client = s3.client()
        self.platform = open_platform(settings)
        base = demo_pipeline(settings)
        source = dataclasses.replace(base.source, landing=self.uri)
        assert isinstance(source, FileSource)
        self.pipeline: Pipeline = dataclasses.replace(base, source=source)

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"events/dt={DAY}/{name}", Body=data)

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"events/dt={DAY}/{name}")

    def discover(self, **settings: Any) -> Any:
        spec = discovery_of(self.pipeline, self.settings)
        return discover(self.platform, spec, **settings)

    def run(self) -> Any:
        # Executors take credentials from their own environment (the standard chain): in
        # local mode that is the Spark application's executor environment.
        spark_for(self.settings).sparkContext.environment.update(self.s3.env)
        return run_pipeline(self.settings, self.pipeline)

    def output(self) -> Counter[str]:
        if not self.settings.output_path.exists():
            return Counter()
        table = ds.dataset(self.settings.output_path, format="parquet").to_table(
            columns=["event_id"]
        )
        return Counter(str(i) for i in table.column("event_id").to_pylist())

    def quarantined(self) -> dict[str, tuple[str, str]]:
        found = quarantined(self.platform.engine, self.settings.source_name)
        return {s.uri.rsplit("/", 1)[-1]: (s.reason, s.last_error) for s in found}


@pytest.fixture
def landing(s3: S3Server, make_settings: MakeSettings) -> Iterator[Landing]:
    settings = make_settings(
        demo_users=100,
        demo_days=1,
        split_max_attempts=1,
        target_split_bytes=64 << 10,  # the big JSON Lines object is cut into byte ranges
        s3_endpoint_url=s3.endpoint_url,
        s3_region="us-east-1",
    )
    made = Landing(s3, settings)
    prepare_demo(settings, made.platform, events=False)
    yield made
    made.platform.close()


def test_s3_landing_every_format_exactly_once_changes_refused_then_retried(
    landing: Landing, caplog: pytest.LogCaptureFixture
) -> None:
    big, spaced, uni = _events("big", 3000), _events("sp", 200), _events("uni", 150)
    plain_csv, gz, parq = _events("csv", 300), _events("gz", 250), _events("pq", 4000)
    replaced, deleted = _events("old", 100), _events("del", 120)
    landing.put("big.jsonl", _jsonl(big))  # ~360 KB: byte ranges of 64 KiB
    landing.put("with space.jsonl", _jsonl(spaced))
    landing.put("café ü.jsonl", _jsonl(uni))
    landing.put("plain.csv", _csv(plain_csv))
    landing.put("zipped.jsonl.gz", gzip.compress(_jsonl(gz)))
    landing.put("table.parquet", _parquet(parq))  # ~300 KB: row-group ranges
    landing.put("replaced.jsonl", _jsonl(replaced))
    landing.put("deleted 100%#?.jsonl", _jsonl(deleted))
    landing.put("_in_flight.jsonl", _jsonl(_events("tmp", 5)))  # a marker: never data
    # Keys that could name something outside the prefix: skipped, one logged line each.
    odd = _jsonl(_events("odd", 7))
    landing.client.put_object(Bucket=landing.bucket, Key=f"events/dt={DAY}/../up.jsonl", Body=odd)
    landing.client.put_object(Bucket=landing.bucket, Key=f"events/dt={DAY}//lead.jsonl", Body=odd)
    landing.client.put_object(Bucket=landing.bucket, Key=f"/events/dt={DAY}/abs.jsonl", Body=odd)

    found = landing.discover()
    assert found.files_seen == 8 and found.skipped_names == 2
    ranges = -(-len(_jsonl(big)) // (64 << 10))
    groups = len(_row_group_ranges(io.BytesIO(_parquet(parq)), 64 << 10))
    assert ranges > 1 and groups > 1
    assert found.splits_registered == ranges + groups + 6  # and 6 whole files
    odd_lines = [r.getMessage() for r in caplog.records if "path segment" in r.getMessage()]
    assert len(odd_lines) == 2

    # After discovery: one object overwritten (another size), one deleted.
    time.sleep(1.05)  # another second: S3's Last-Modified has whole seconds
    replaced_now = _events("new", 130)
    landing.put("replaced.jsonl", _jsonl(replaced_now))
    landing.delete("deleted 100%#?.jsonl")

    landing.run()
    oracle = _ids(big, spaced, uni, plain_csv, gz, parq)
    assert landing.output() == oracle  # every good object's events, exactly once
    refused = landing.quarantined()
    assert set(refused) == {"replaced.jsonl", "deleted 100%#?.jsonl"}
    reason, error = refused["replaced.jsonl"]
    assert reason == "changed since discovery" and "size " in error
    assert refused["deleted 100%#?.jsonl"][0] == "file not found"

    # The owner fixes it: the deleted object is back. retry reads both as they are now.
    landing.put("deleted 100%#?.jsonl", _jsonl(deleted))
    storage = StorageOptions.of(landing.settings)
    retried = retry_splits(
        landing.platform.engine, None, source=landing.settings.source_name, storage=storage
    )
    assert len(retried) == 2
    landing.run()
    assert landing.output() == oracle + _ids(replaced_now, deleted)
    assert landing.quarantined() == {}
    # Nothing more to read, and the second discovery tick registers nothing again.
    assert landing.discover().splits_registered == 0
    assert SECRET_KEY not in caplog.text


def test_s3_bad_inputs_are_one_line_and_leave_nothing_registered(
    landing: Landing, s3: S3Server
) -> None:
    landing.put("a.jsonl", _jsonl(_events("a", 10)))
    settings, pipeline = landing.settings, landing.pipeline

    def error_of(spec_settings: TestSettings, uri: str) -> str:
        source = dataclasses.replace(pipeline.source, landing=uri)
        assert isinstance(source, FileSource)
        spec = discovery_of(dataclasses.replace(pipeline, source=source), spec_settings)
        with pytest.raises(StorageError) as caught:
            discover(landing.platform, spec)
        text = str(caught.value)
        assert "\n" not in text and SECRET_KEY not in text and uri in text
        return text

    # An endpoint nobody listens on: a few seconds (short timeouts), not minutes.
    closed = _closed_endpoint()
    began = time.monotonic()
    text = error_of(settings.model_copy(update={"s3_endpoint_url": closed}), landing.uri)
    assert "unreachable" in text and "SLUICE_S3_ENDPOINT_URL" in text and closed in text
    assert time.monotonic() - began < 20
    with s3.require_auth():  # the server now checks credentials: ours are unknown to it
        text = error_of(settings, landing.uri)
    assert "access denied" in text and "AWS_ACCESS_KEY_ID" in text
    text = error_of(settings, "s3://no-such-bucket-sluice/events")
    assert "bucket does not exist" in text

    with pytest.raises(ConfigError, match=r"unsupported scheme 'ftp://'"):
        open_location("ftp://host/landing", what="landing")
    with pytest.raises(ValueError, match=r"landing 'ftp://host/x': unsupported scheme"):
        _plan_with_landing(pipeline, "ftp://host/x")
    with pytest.raises(ValueError, match="credentials do not belong in the URI"):
        _plan_with_landing(pipeline, "s3://key:pw@bucket/x")

    # Nothing was registered by the failures; a healthy tick finds the object, the next
    # tick (the bounded cursor) nothing new, then only the object that appeared since.
    assert landing.discover().splits_registered == 1
    assert landing.discover().splits_registered == 0
    landing.put("b.jsonl", _jsonl(_events("b", 10)))
    assert landing.discover().splits_registered == 1
    assert landing.discover(dates=[date(2026, 1, 1)]).splits_registered == 0

    # What travels to a Spark task: the URI and the non-secret options, no credentials.
    location = open_location(landing.uri, StorageOptions.of(settings))
    shipped = pickle.dumps(location)
    assert SECRET_KEY.encode() not in shipped
    assert pickle.loads(shipped).uri == landing.uri  # noqa: S301 (our own bytes)


def test_s3_object_overwritten_or_deleted_while_read_is_never_half_of_each(s3: S3Server) -> None:
    """Every request to the store is followed by an identity check: bytes of the new version
    are never handed out after bytes of the old one (``FileChangedError``, quarantined at
    once), and an object deleted mid-read is the file-gone rule (``FileNotFoundError``)."""
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    landing = ObjectLanding.of(
        f"s3://{bucket}/events", StorageOptions(s3.endpoint_url, "us-east-1")
    )
    client, key = s3.client(), "events/big.jsonl"
    old = b"o" * (READ_BYTES + 1000)  # two requests: the second comes after the change
    for change in ("overwrite", "delete"):
        client.put_object(Bucket=bucket, Key=key, Body=old)
        uri = f"s3://{bucket}/{key}"
        recorded = landing.current(uri)
        assert recorded is not None and recorded.inode is None
        with landing.open(uri, recorded) as file:
            first = file.read(READ_BYTES)
            assert first == old[:READ_BYTES]
            time.sleep(1.05)  # Last-Modified has whole seconds
            if change == "overwrite":
                client.put_object(Bucket=bucket, Key=key, Body=b"n" * len(old))  # same size
                with pytest.raises(FileChangedError, match="changed since discovery: mtime"):
                    file.read()
            else:
                client.delete_object(Bucket=bucket, Key=key)
                with pytest.raises(FileNotFoundError):
                    file.read()


@pytest.mark.parametrize("policy", ["refuse", "reprocess"])
def test_s3_object_overwritten_before_its_run_is_a_new_version(
    s3: S3Server, make_settings: MakeSettings, policy: str
) -> None:
    """Discovery that sees a registered object with another size or mtime registers it as
    a new version (no inode: never an append): quarantined under ``refuse`` with what
    changed, in the pool under ``reprocess``; the old version's unread split superseded."""
    settings = make_settings(
        s3_endpoint_url=s3.endpoint_url, s3_region="us-east-1", file_change_policy=policy
    )
    made = Landing(s3, settings)
    try:
        made.put("a.jsonl", _jsonl(_events("a", 10)))
        assert made.discover().splits_registered == 1
        time.sleep(1.05)
        made.put("a.jsonl", _jsonl(_events("a", 12)))  # grown: on a store, a new object
        again = made.discover()
        assert again.changed_files == 1
        counts = SplitStore(made.platform.engine).counts(settings.source_name)
        if policy == "refuse":
            assert counts == {"FAILED": 1, "SUPERSEDED": 1}
            ((reason, error),) = made.quarantined().values()
            assert reason == "changed since discovery" and "size " in error
            # A retry while the store cannot be reached leaves it quarantined (one warning),
            # a retry that reaches it puts it back.
            engine, source = made.platform.engine, settings.source_name
            down = StorageOptions(_closed_endpoint(), "us-east-1")
            assert retry_splits(engine, None, source=source, storage=down) == []
            assert len(made.quarantined()) == 1
            up = StorageOptions.of(settings)
            assert len(retry_splits(engine, None, source=source, storage=up)) == 1
            assert made.quarantined() == {}
        else:
            assert counts == {"UNASSIGNED": 1, "SUPERSEDED": 1}
    finally:
        made.platform.close()
