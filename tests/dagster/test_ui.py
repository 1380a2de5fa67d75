"""The Dagster UI for real: ``dagster dev``, a backfill through GraphQL, headless Chromium.

Starts ``dagster dev`` (webserver, daemon and code server) on 127.0.0.1 with a temporary
``DAGSTER_HOME`` and a pipeline module of the test's own registered with ``SLUICE_PIPELINES``
(the clickstream example under the test's name, folders and users table), on the shipped
defaults: the asset's partitions are the days discovered (the daemon's tick of
``<pipeline>_report_completions`` adds the two landing days: two partitions, not every day
since the start date). It launches a backfill of those partitions with the GraphQL mutation
the UI sends and waits for it to succeed; then a third day processed by the CLI, outside
Dagster, shows in the asset's partition status once the daemon's reporter tick has reported
its completion. Finally it loads the asset page in Debian's headless ``chromium`` and saves a
screenshot. The GraphQL tests need no browser; the page tests skip with a clear reason where
``chromium`` is absent.

Everything the runs need reaches ``dagster dev`` (and, through it, the code server and the run
workers) as environment variables: ``SLUICE_*`` and ``PYTHONPATH`` (where the pipeline module
is). The whole process group is stopped afterwards.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, NoReturn

import pyarrow.parquet as pq
import pytest

from enumerator_service import Settings, asyncpg_dsn, load_settings
from examples._clickstream_data import DemoSpec, generate_events, load_users

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = ["2026-01-01", "2026-01-02"]
#: The day the CLI processes outside Dagster.
CLI_DAY = "2026-01-03"
STARTUP_TIMEOUT = 120.0
#: The reporter sensor ticks every 30 s under the daemon.
REPORT_TIMEOUT = 180.0
BACKFILL_TIMEOUT = 360.0
BROWSER_TIMEOUT = 120.0

pytestmark = [pytest.mark.spark, pytest.mark.ui, pytest.mark.timeout(900)]

#: The pipeline module the test registers: the clickstream example under the test's name,
#: reading its landing folder, looking users up in its own table, writing its own folder.
PIPELINE_MODULE = '''"""The pipeline of test_ui (written by the test; SLUICE_PIPELINES names it)."""

import dataclasses

from examples.clickstream import clickstream
from spark_jobs import ParquetSink

{name} = dataclasses.replace(
    clickstream,
    name="{name}",
    source=dataclasses.replace(clickstream.source, landing="{landing}", start_date="{start}"),
    steps=[dataclasses.replace(clickstream.steps[0], table="{users}")],
    sink=ParquetSink("enriched_{name}"),
)
'''

# --------------------------------------------------------------------------- GraphQL

# The mutation the UI's "Materialize selected partitions" dialog sends (dagster-webserver 1.13).
LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""

BACKFILL_STATUS = """
query BackfillStatus($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      partitionNames
      assetSelection { path }
      error { message stack }
    }
    ... on Error { message }
  }
}
"""

WORKSPACE = """
query Workspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on PythonError { message stack }
        }
      }
    }
    ... on Error { message }
  }
}
"""

BACKFILL_RUNS = """
query BackfillRuns($tags: [ExecutionTag!]) {
  runsOrError(filter: {tags: $tags}) {
    __typename
    ... on Runs { results { runId status tags { key value } } }
    ... on Error { message }
  }
}
"""

RUN_ERRORS = """
query RunErrors($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message level stepKey }
        ... on ErrorEvent { error { message stack } }
      }
    }
    ... on Error { message }
  }
}
"""

ASSET_STATE = """
query AssetState($assetKey: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode { partitionStats { numMaterialized numPartitions numFailed } }
    ... on Error { message }
  }
  assetOrError(assetKey: $assetKey) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        partition
        runId
        metadataEntries {
          label
          ... on IntMetadataEntry { intValue }
          ... on BoolMetadataEntry { boolValue }
        }
      }
    }
    ... on Error { message }
  }
}
"""


class GraphQLError(Exception):
    """The endpoint answered with GraphQL errors (or not with JSON)."""


def graphql(
    port: int, query: str, variables: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """POST one GraphQL operation to the webserver; the ``data`` of the answer."""
    body = json.dumps({"query": query, "variables": variables or {}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/graphql", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
    finally:
        conn.close()
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise GraphQLError(f"HTTP {response.status}: {text[:500]}") from exc
    if answer.get("errors"):
        raise GraphQLError(json.dumps(answer["errors"], indent=2)[:4000])
    data: dict[str, Any] = answer["data"]
    return data


# --------------------------------------------------------------------------- dagster dev


@dataclass
class DagsterDev:
    """A running ``dagster dev`` and the dataset its runs read."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    settings: Settings
    workdir: Path
    #: The test's pipeline: its name (the asset) and its output folder.
    asset: str
    output: Path
    #: The environment of the deployment (the CLI runs with it too).
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self, lines: int = 300) -> str:
        """The tail of the combined dagster dev / daemon / webserver / run worker output."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def fail(self, message: str) -> NoReturn:
        pytest.fail(f"{message}\n--- dagster dev log ({self.log}), last lines:\n{self.logs()}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def session_members(session_id: int) -> list[int]:
    """Processes still in the session ``dagster dev`` started (setsid made it its leader)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def stop_process_group(process: subprocess.Popen[bytes]) -> list[int]:
    """Stop ``dagster dev`` and everything it started; the pids that had to be SIGKILLed."""
    leader = process.pid
    # Graceful first: dagster dev turns SIGINT into an orderly shutdown of its services.
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)  # (it can take longer; then the group is stopped below)
    # Then the whole process group (run workers, Spark JVMs, the code server).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while session_members(leader) and time.monotonic() < deadline:
        time.sleep(0.5)
    killed = session_members(leader)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)
    for pid in session_members(leader):  # anything that moved to a process group of its own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    # A SIGKILLed process is gone once the kernel has torn it down (its memory, its files):
    # on a busy machine that takes a moment after the signal.
    deadline = time.monotonic() + 10
    while session_members(leader) and time.monotonic() < deadline:
        time.sleep(0.2)
    return killed


def wait_until_loaded(dev: DagsterDev) -> None:
    """Wait for the GraphQL endpoint to answer and the code location to be loaded."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    last = "no answer yet"
    while time.monotonic() < deadline:
        if dev.process.poll() is not None:
            dev.fail(f"dagster dev exited with code {dev.process.returncode} while starting")
        try:
            workspace = graphql(dev.port, WORKSPACE, timeout=10)["workspaceOrError"]
        except (OSError, http.client.HTTPException, GraphQLError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            entries = workspace.get("locationEntries", [])
            for entry in entries:
                loaded = entry["locationOrLoadError"] or {}
                if loaded.get("__typename") == "PythonError":
                    dev.fail(f"code location {entry['name']} failed to load: {loaded}")
                if entry["loadStatus"] == "LOADED" and loaded.get("__typename"):
                    return
            last = json.dumps(workspace)[:500]
        time.sleep(1)
    dev.fail(f"dagster dev not ready after {STARTUP_TIMEOUT:.0f}s; last answer: {last}")


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory: pytest.TempPathFactory, db_url: str) -> Iterator[DagsterDev]:
    """``dagster dev`` on a free port, its runs on the test database and a small dataset."""
    workdir = tmp_path_factory.mktemp("dagster_ui")
    token = secrets.token_hex(3)
    name, users = f"ui_{token}", f"users_{token}"
    settings = load_settings(
        database_url=db_url,
        home=workdir / "home",
        data_dir=workdir / "data",
        spark_master="local[2]",
        parallelism=2,
        checkpoint_interval_seconds=1.0,
        demo_events=4000,
        demo_users=3000,
        demo_days=len(PARTITIONS),
        demo_files_per_day=2,
        demo_start_date=date.fromisoformat(PARTITIONS[0]),
    )
    landing = settings.data_path / "landing" / name
    generate_events(landing, DemoSpec.from_settings(settings))
    load_users(
        asyncpg_dsn(db_url),
        schema="public",
        table=users,
        key="id",
        users=settings.demo_users,
        seed=settings.demo_seed,
    )
    # The user's pipeline module, importable by the code server and the run workers.
    modules = workdir / "modules"
    modules.mkdir()
    (modules / f"{name}_pipeline.py").write_text(
        PIPELINE_MODULE.format(
            name=name, landing=str(landing), start=PARTITIONS[0], users=f"public.{users}"
        )
    )

    # The Dagster home as `make ui` makes it (`sluice dagster-home`: no telemetry, no
    # first-visit dialog over the page the screenshot shows).
    made = subprocess.run(
        [str(Path(sys.executable).parent / "sluice"), "dagster-home"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "DAGSTER_"))},
            "SLUICE_HOME": str(settings.home_path),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    dagster_home = Path(made.stdout.strip())
    assert dagster_home == settings.home_path / "dagster"

    # Nothing of the caller's Sluice or Dagster configuration leaks into the deployment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(dagster_home),
        SLUICE_DATABASE_URL=db_url,
        SLUICE_HOME=str(settings.home_path),
        SLUICE_DATA_DIR=str(settings.data_dir.absolute()),
        SLUICE_PIPELINES=f"{name}_pipeline",
        PYTHONPATH=os.pathsep.join([str(modules), *filter(None, [os.environ.get("PYTHONPATH")])]),
        SLUICE_SPARK_MASTER=settings.spark_master,
        SLUICE_PARALLELISM=str(settings.parallelism),
        SLUICE_CHECKPOINT_INTERVAL_SECONDS=str(settings.checkpoint_interval_seconds),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONUNBUFFERED="1",
    )
    port = free_port()
    log = workdir / "dagster_dev.log"
    command = [
        str(Path(sys.executable).parent / "dagster"),
        "dev",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-m",
        "dagster_project.definitions",
        "--log-level",
        "info",
        "--code-server-log-level",
        "warning",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group and session, stopped as a whole
        )
    dev = DagsterDev(
        process=process,
        port=port,
        log=log,
        settings=settings,
        workdir=workdir,
        asset=name,
        output=settings.warehouse_path / f"enriched_{name}",
        env=env,
    )
    try:
        wait_until_loaded(dev)
        yield dev
    finally:
        killed = stop_process_group(process)
        if killed:
            print(f"\nSIGKILLed leftover dagster dev processes: {killed}")
        assert not session_members(process.pid), "dagster dev left processes behind"


@dataclass(frozen=True)
class Backfill:
    backfill_id: str
    status: str
    seconds: float
    answer: dict[str, Any]


SUCCEEDED = {"COMPLETED", "COMPLETED_SUCCESS"}
FINISHED = SUCCEEDED | {"COMPLETED_FAILED", "FAILED", "CANCELED"}


def asset_state(dev: DagsterDev, partitions: list[str]) -> dict[str, Any]:
    """The asset's partition status and its materialisations of ``partitions``."""
    return graphql(
        dev.port, ASSET_STATE, {"assetKey": {"path": [dev.asset]}, "partitions": partitions}
    )


def wait_for_stats(dev: DagsterDev, partitions: list[str], materialized: int) -> dict[str, Any]:
    """Poll until the asset offers exactly ``partitions`` and ``materialized`` of them are
    materialised (the daemon's reporter tick adds and reports them)."""
    deadline = time.monotonic() + REPORT_TIMEOUT
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if dev.process.poll() is not None:
            dev.fail(f"dagster dev exited with code {dev.process.returncode}")
        state = asset_state(dev, partitions)
        stats = state["assetNodeOrError"]["partitionStats"]
        if stats and (stats["numPartitions"], stats["numMaterialized"]) == (
            len(partitions),
            materialized,
        ):
            return state
        time.sleep(2)
    dev.fail(f"not {len(partitions)} partitions, {materialized} materialised: {state}")


@pytest.fixture(scope="module")
def backfill(dagster_dev: DagsterDev) -> Backfill:
    """A backfill of the two partitions launched as the UI does, polled until it finishes."""
    dev = dagster_dev
    # The partitions offered are the two landing days, added by the reporter's first tick.
    wait_for_stats(dev, PARTITIONS, materialized=0)
    params = {
        "partitionNames": PARTITIONS,
        "assetSelection": [{"path": [dev.asset]}],
        "fromFailure": False,
        "tags": [{"key": "sluice/test", "value": "test_ui"}],
        "title": "test_ui backfill",
    }
    started = time.monotonic()
    launched = graphql(dev.port, LAUNCH_BACKFILL, {"backfillParams": params})
    result = launched["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        dev.fail(f"launchPartitionBackfill failed: {json.dumps(result, indent=2)}")
    backfill_id = result["backfillId"]

    deadline = started + BACKFILL_TIMEOUT
    answer: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if dev.process.poll() is not None:
            dev.fail(f"dagster dev exited with code {dev.process.returncode} during the backfill")
        answer = graphql(dev.port, BACKFILL_STATUS, {"backfillId": backfill_id})
        answer = answer["partitionBackfillOrError"]
        if answer["__typename"] != "PartitionBackfill":
            dev.fail(f"partitionBackfillOrError: {json.dumps(answer, indent=2)}")
        if answer["status"] in FINISHED:
            break
        time.sleep(2)
    else:
        dev.fail(
            f"backfill {backfill_id} not finished after {BACKFILL_TIMEOUT:.0f}s: "
            f"{json.dumps(answer)}\n{run_report(dev, backfill_id)}"
        )
    seconds = time.monotonic() - started
    print(f"\nbackfill {backfill_id}: {answer['status']} after {seconds:.0f}s")
    return Backfill(backfill_id, answer["status"], seconds, answer)


def backfill_runs(port: int, backfill_id: str) -> list[dict[str, Any]]:
    tags = [{"key": "dagster/backfill", "value": backfill_id}]
    runs = graphql(port, BACKFILL_RUNS, {"tags": tags})["runsOrError"]
    assert runs["__typename"] == "Runs", runs
    results: list[dict[str, Any]] = runs["results"]
    return results


def run_report(dev: DagsterDev, backfill_id: str) -> str:
    """Status and error events of every run of the backfill (for failure messages)."""
    lines = []
    for run in backfill_runs(dev.port, backfill_id):
        tags = {tag["key"]: tag["value"] for tag in run["tags"]}
        lines.append(f"run {run['runId']} ({tags.get('dagster/partition')}): {run['status']}")
        logs = graphql(dev.port, RUN_ERRORS, {"runId": run["runId"]})["logsForRun"]
        for event in logs.get("events", []):
            error = event.get("error")
            if event.get("level") == "ERROR" or error:
                lines.append(f"  [{event.get('stepKey')}] {event.get('message')}")
                if error:
                    lines.append("    " + error["message"] + "".join(error.get("stack") or []))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the tests


def test_backfill_of_two_partitions_succeeds(dagster_dev: DagsterDev, backfill: Backfill) -> None:
    dev = dagster_dev
    if backfill.status not in SUCCEEDED:
        dev.fail(
            f"backfill {backfill.backfill_id} ended {backfill.status}: "
            f"{json.dumps(backfill.answer, indent=2)}\n{run_report(dev, backfill.backfill_id)}"
        )
    assert sorted(backfill.answer["partitionNames"]) == PARTITIONS
    assert backfill.answer["assetSelection"] == [{"path": [dev.asset]}]

    # Every run of the backfill succeeded: one per partition, or a single run over the range
    # (BackfillPolicy.single_run), whichever the asset's policy asks for.
    runs = backfill_runs(dev.port, backfill.backfill_id)
    assert runs, f"no runs tagged with backfill {backfill.backfill_id}"
    assert {run["status"] for run in runs} == {"SUCCESS"}, run_report(dev, backfill.backfill_id)

    # Dagster recorded a materialization of each partition, by a run of this backfill, with
    # the pipeline's metadata.
    state = asset_state(dev, PARTITIONS)
    stats = state["assetNodeOrError"]["partitionStats"]
    assert stats["numMaterialized"] == stats["numPartitions"] == len(PARTITIONS), stats
    assert stats["numFailed"] == 0, stats
    materializations = state["assetOrError"]["assetMaterializations"]
    assert sorted(m["partition"] for m in materializations) == PARTITIONS
    assert {m["runId"] for m in materializations} <= {run["runId"] for run in runs}
    for materialization in materializations:
        metadata = {
            entry["label"]: entry.get("intValue", entry.get("boolValue"))
            for entry in materialization["metadataEntries"]
        }
        assert metadata["rows_out"] > 0, metadata
        assert metadata["nothing_new"] is False, metadata
        assert metadata["rows_in"] == metadata["rows_out"] + metadata["dead_letters"], metadata

    # And the Parquet output of both days is on disk.
    output = dev.output
    rows = {
        day: sum(
            pq.ParquetFile(f).metadata.num_rows for f in (output / f"dt={day}").rglob("*.parquet")
        )
        for day in PARTITIONS
    }
    assert all(count > 0 for count in rows.values()), rows
    print(f"\nrows per partition: {rows}; {len(runs)} run(s), {backfill.seconds:.0f}s")


@pytest.mark.extended  # ~45 s: make faults, not CI (the UI tests above cover the page)
def test_a_day_the_cli_processed_shows_in_the_partition_status(
    dagster_dev: DagsterDev, backfill: Backfill
) -> None:
    """Issue 14's story: a day processed by the CLI — not by Dagster — is a partition
    the UI offers and shows materialised, reported once by the daemon's reporter tick, with
    the completion's counts; the backfill's days keep their own materialisations."""
    dev = dagster_dev
    settings = dev.settings
    spec = DemoSpec(
        events=1000,
        days=1,
        files_per_day=1,
        users=settings.demo_users,
        start_date=date.fromisoformat(CLI_DAY),
        seed=3,
    )
    generate_events(settings.data_path / "landing" / dev.asset, spec)
    for command in ("discover", "run"):
        ran = subprocess.run(
            [str(Path(sys.executable).parent / "sluice"), command, dev.asset],
            cwd=REPO,
            env=dev.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "Nothing new" not in ran.stdout, ran.stdout
    days = [*PARTITIONS, CLI_DAY]
    state = wait_for_stats(dev, days, materialized=len(days))
    by_day: dict[str, list[dict[str, Any]]] = {}
    for materialization in state["assetOrError"]["assetMaterializations"]:
        by_day.setdefault(materialization["partition"], []).append(materialization)
    assert sorted(by_day) == days and all(len(m) == 1 for m in by_day.values()), by_day
    (reported,) = by_day[CLI_DAY]
    assert reported["runId"] not in {
        run["runId"] for run in backfill_runs(dev.port, backfill.backfill_id)
    }
    metadata = {
        entry["label"]: entry.get("intValue", entry.get("boolValue"))
        for entry in reported["metadataEntries"]
    }
    rows = sum(
        pq.ParquetFile(f).metadata.num_rows
        for f in (dev.output / f"dt={CLI_DAY}").rglob("*.parquet")
    )
    assert metadata["rows"] == rows > 0, metadata
    assert metadata["generation"] == 1, metadata


#: The title of dagster-webserver's first-visit dialog (shown over any page on 127.0.0.1).
NUX_DIALOG = "Join the Dagster community"
SHOULD_SHOW_NUX = "query ShouldShowNux { shouldShowNux }"


def find_chromium() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def run_chromium(chromium: str, workdir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """One headless Chromium invocation, in its own process group, killed if it hangs."""
    profile = workdir / f"chromium-profile-{secrets.token_hex(3)}"
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "--virtual-time-budget=15000",
        *args,
    ]
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=BROWSER_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"chromium did not finish within {BROWSER_TIMEOUT:.0f}s: {command}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # helpers (zygote, GPU) it left behind
        shutil.rmtree(profile, ignore_errors=True)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def png_colours(path: Path) -> tuple[int, int, Counter[bytes]]:
    """(width, height, pixel colour counts) of an 8-bit, non-interlaced RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    position, idat = 8, []
    width = height = channels = 0
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour_type in (2, 6), (depth, colour_type)
            channels = 3 if colour_type == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    colours: Counter[bytes] = Counter()
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + predictor) & 0xFF
        colours.update(bytes(line[i : i + 3]) for i in range(0, stride, channels))
        previous = line
    return width, height, colours


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, or a skip saying why (requested first: before dagster dev starts)."""
    found = find_chromium()
    if found is None:
        pytest.skip(
            "Debian's chromium is not installed (apt-get install chromium): "
            "the Dagster UI page cannot be rendered and screenshotted"
        )
    return found


def test_the_first_visit_opens_on_the_page_without_a_dialog(
    chromium: str, dagster_dev: DagsterDev
) -> None:
    """A first visit (fresh browser profile, nothing dismissed) to the home `make ui` makes:
    the server does not ask for the dialog and the rendered page has none."""
    dev = dagster_dev
    dom = run_chromium(chromium, dev.workdir, "--dump-dom", f"{dev.url}/assets")
    html = dom.stdout.decode("utf-8", "replace")
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-3000:]
    (dev.workdir / "first_visit.html").write_text(html)
    assert dev.asset in html, "the asset list did not render (saved as first_visit.html)"
    assert NUX_DIALOG not in html, "the first-visit dialog is over the page"
    # And the screenshot: the page's own light background covers most of it (a dialog's
    # backdrop would dim the whole page grey).
    screenshot = dev.workdir / "first_visit.png"
    shot = run_chromium(chromium, dev.workdir, f"--screenshot={screenshot}", f"{dev.url}/assets")
    assert shot.returncode == 0 and screenshot.is_file(), shot.stderr.decode(errors="replace")
    _, _, colours = png_colours(screenshot)
    background, _ = colours.most_common(1)[0]
    print(f"\nfirst visit: {screenshot}; background #{background.hex()}")
    assert min(background) >= 0xF0, f"background #{background.hex()}: dimmed by a dialog?"
    assert graphql(dev.port, SHOULD_SHOW_NUX)["shouldShowNux"] is False


def test_asset_page_renders_in_headless_chromium(
    chromium: str, dagster_dev: DagsterDev, backfill: Backfill
) -> None:
    dev = dagster_dev
    page = f"{dev.url}/assets/{dev.asset}"

    dom = run_chromium(chromium, dev.workdir, "--dump-dom", page)
    html = dom.stdout.decode("utf-8", "replace")
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-3000:]
    (dev.workdir / f"{dev.asset}.html").write_text(html)
    # The asset page itself, showing the backfill's materialization and its metadata (not the
    # loading spinner or an "asset not found" page).
    for text in (dev.asset, "Latest materialization"):
        assert text in html, f"{text!r} missing from the rendered page (saved next to the log)"
    # The latest materialisation, its day and its metadata: the backfill's (rows_out), or the
    # reported completion of the CLI's day (late_records) when that test ran before.
    assert PARTITIONS[-1] in html or CLI_DAY in html, "no materialised day shown"
    assert "rows_out" in html or "late_records" in html, "no materialisation metadata shown"
    assert NUX_DIALOG not in html, "the first-visit dialog is over the page"

    screenshot = dev.workdir / f"{dev.asset}.png"
    shot = run_chromium(chromium, dev.workdir, f"--screenshot={screenshot}", page)
    assert shot.returncode == 0, shot.stderr.decode(errors="replace")[-3000:]
    assert screenshot.is_file(), shot.stderr.decode(errors="replace")[-3000:]
    print(f"\nscreenshot of {page}: {screenshot} ({screenshot.stat().st_size:,} bytes)")
    assert screenshot.stat().st_size > 20_000, "screenshot too small to show a rendered page"

    width, height, colours = png_colours(screenshot)
    assert (width, height) == (1400, 1000)
    _, most_common = colours.most_common(1)[0]
    # A blank or loading page is one background colour; the asset page has text, icons, tables.
    assert len(colours) > 100, f"only {len(colours)} colours: a blank page?"
    assert most_common < 0.93 * width * height, "one colour covers nearly the whole page"
