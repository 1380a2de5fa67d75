"""The Delta sink on an S3-protocol server (moto; pyarrow writes the data files, delta-rs the
log): the demo into a table under the warehouse bucket, read back with delta-rs through the
same endpoint, exactly the landing oracle's events; no secret in the table's log."""

from __future__ import annotations

import dataclasses
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from conftest import TestSettings as Settings
from deltalake import DeltaTable
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events
from s3_server import SECRET_KEY, S3Server, s3_server, set_standard_chain

from enumerator_service._operations import open_platform
from spark_jobs import DeltaSink
from spark_jobs.jobs import run_pipeline

#: ~55 s here (moto, in its own process: see s3_server, through pyarrow and delta-rs'
#: object_store): the extended suite.
pytestmark = [pytest.mark.spark, pytest.mark.extended]

set_standard_chain()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server(own_process=True) as server:
        yield server


def test_the_demo_into_a_delta_table_on_s3(s3: S3Server, make_settings: Any) -> None:
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    settings: Settings = make_settings(
        warehouse_dir=f"s3://{bucket}/warehouse", demo_events=120, demo_days=2
    )
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    platform.close()
    pipeline = dataclasses.replace(demo_pipeline(settings), sink=DeltaSink("lake/events"))
    run_pipeline(settings, pipeline)

    uri = f"s3://{bucket}/warehouse/lake/events"
    storage = {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
    }
    rows = DeltaTable(uri, storage_options=storage).to_pyarrow_table().to_pylist()
    oracle, _bad = expected_events(Path(settings.landing_path))
    got = Counter(r["event_id"] for r in rows)
    wanted = Counter(r["event_id"] for r in oracle)
    assert sum((got - wanted).values()) == 0 and sum((wanted - got).values()) == 0
    assert all(r["dt"] == r["event_time"].date() for r in rows)
    log = s3.admin().get_file_info(pafs.FileSelector(f"{bucket}/warehouse/lake/events/_delta_log"))
    for info in log:
        if info.path.endswith(".json"):
            with s3.admin().open_input_stream(info.path) as stream:
                assert SECRET_KEY not in stream.read().decode()
