"""Checks a page runs at its ``<!-- docs-test: check: <name> -->`` lines (``test_doc_blocks``):
what a reader does by clicking, driven by the test, and assertions on what came out.

The tutorial's Dagster part: ``dagster dev`` was started by a background block on
``127.0.0.1:<run.port>``; the checks talk to it through the GraphQL API its UI uses.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from docs_runner import PageRun, stop_background

CHECKS: dict[str, Callable[[PageRun], None]] = {}

#: The mutation the UI's "Launch backfill" button sends (dagster-webserver 1.13).
LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
    ... on PythonError { message stack }
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
          ... on RepositoryLocation {
            repositories { name sensors { name sensorState { status } } }
          }
        }
      }
    }
  }
}
"""

PARTITIONS = """
query Partitions($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode { partitionKeys }
  }
}
"""

BACKFILL_RUNS = """
query BackfillRuns($tags: [ExecutionTag!]) {
  runsOrError(filter: {tags: $tags}) {
    __typename
    ... on Runs { results { runId status } }
  }
}
"""

MATERIALIZATIONS = """
query Materializations($assetKey: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $assetKey) {
    __typename
    ... on Asset { assetMaterializations(partitions: $partitions) { partition runId } }
  }
}
"""

STARTUP_TIMEOUT = 180.0
BACKFILL_TIMEOUT = 420.0


#: Automation → the sensor's toggle, on and off (dagster-webserver 1.13).
START_SENSOR = """
mutation StartSensor($sensorSelector: SensorSelector!) {
  startSensor(sensorSelector: $sensorSelector) {
    __typename
    ... on Sensor { id sensorState { id status } }
    ... on PythonError { message stack }
  }
}
"""

STOP_SENSOR = """
mutation StopSensor($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on PythonError { message stack }
  }
}
"""

LIVE_RUNS = """
query LiveRuns($job: String!) {
  runsOrError(filter: {pipelineName: $job, statuses: [QUEUED, STARTING, STARTED]}) {
    ... on Runs { results { runId status } }
  }
}
"""

#: A run's Terminate button.
TERMINATE_RUN = """
mutation TerminateRun($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on PythonError { message stack }
  }
}
"""

#: The tutorial promises "within a minute"; a loaded 2-core machine gets twice that.
CONTINUOUS_TIMEOUT = 150.0


def graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST one GraphQL operation to the webserver; the ``data`` of the answer."""
    body = json.dumps({"query": query, "variables": variables or {}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/graphql", body, {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    if answer.get("errors"):
        raise AssertionError(f"GraphQL errors: {json.dumps(answer['errors'])[:2000]}")
    data: dict[str, Any] = answer["data"]
    return data


def _background_log(run: PageRun, lines: int = 80) -> str:
    if not run.background:
        return ""
    log: Path = run.background[-1][2]
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n--- dagster dev, last lines:\n" + "\n".join(text.splitlines()[-lines:])


def _until(run: PageRun, what: str, timeout: float, probe: Callable[[], object | None]) -> object:
    """Poll ``probe`` every second until it returns something; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        for _, process, _ in run.background:
            if process.poll() is not None:
                raise AssertionError(
                    f"dagster dev exited {process.returncode}" + _background_log(run)
                )
        try:
            found = probe()
        except (OSError, http.client.HTTPException) as exc:
            found, last = None, exc
        if found is not None:
            return found
        time.sleep(1)
    raise AssertionError(f"{what}: not after {timeout:.0f} s ({last})" + _background_log(run))


def _repositories(run: PageRun) -> list[dict[str, Any]] | None:
    workspace = graphql(run.port, WORKSPACE)["workspaceOrError"]
    for entry in workspace.get("locationEntries", []):
        loaded = entry["locationOrLoadError"] or {}
        if loaded.get("__typename") == "PythonError":
            raise AssertionError(f"code location {entry['name']} failed to load: {loaded}")
        if entry["loadStatus"] == "LOADED" and loaded.get("__typename") == "RepositoryLocation":
            repositories: list[dict[str, Any]] = loaded["repositories"]
            return repositories
    return None


def tutorial_backfill(run: PageRun) -> None:
    """What the tutorial's reader clicks: Materialize… on ``shipments``, the two days,
    Launch backfill. Waits for both days to be materialised by the backfill's run, then
    checks the days' output: written by that run, with the rows the CLI left there."""
    asset = {"path": ["shipments"]}
    days = ["2026-03-01", "2026-03-02"]
    _until(run, "the code location loaded", STARTUP_TIMEOUT, lambda: _repositories(run))

    def offered() -> list[str] | None:
        node = graphql(run.port, PARTITIONS, {"assetKey": asset})["assetNodeOrError"]
        keys = node.get("partitionKeys") or []
        return keys if set(days) <= set(keys) else None

    _until(run, f"the partitions {days} offered", STARTUP_TIMEOUT, offered)
    params = {
        "partitionNames": days,
        "assetSelection": [asset],
        "fromFailure": False,
        "title": "tutorial backfill",
    }
    result = graphql(run.port, LAUNCH_BACKFILL, {"backfillParams": params})
    launched = result["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill = launched["backfillId"]

    def materialised() -> set[str] | None:
        tags = [{"key": "dagster/backfill", "value": backfill}]
        runs = graphql(run.port, BACKFILL_RUNS, {"tags": tags})["runsOrError"]["results"]
        failed = [r for r in runs if r["status"] in ("FAILURE", "CANCELED")]
        if failed:
            raise AssertionError(f"backfill run failed: {failed}" + _background_log(run))
        ids = {r["runId"] for r in runs}
        events = graphql(run.port, MATERIALIZATIONS, {"assetKey": asset, "partitions": days})
        done = {
            event["partition"]
            for event in events["assetOrError"]["assetMaterializations"]
            if event["runId"] in ids
        }
        return ids if done == set(days) else None

    run_ids = _until(
        run, f"backfill {backfill} materialised {days}", BACKFILL_TIMEOUT, materialised
    )
    assert isinstance(run_ids, set) and len(run_ids) == 1, run_ids  # one run for both days
    (run_id,) = run_ids
    output = run.cwd / "data" / "warehouse" / "shipments_by_day"
    for day in days:
        files = [p.name for p in (output / f"dt={day}").glob("*.parquet")]
        assert files and all(f"dagster-{run_id}" in name for name in files), (day, files)
    table = ds.dataset(output, partitioning="hive").to_table()
    by_day: dict[str, list[str]] = {}
    for row in table.to_pylist():
        by_day.setdefault(str(row["dt"]), []).append(row["shipment_id"])
    assert {day: sorted(ids) for day, ids in by_day.items()} == {
        "2026-03-01": ["S-1001", "S-1002", "S-1004", "S-1006"],
        "2026-03-02": ["S-1007", "S-1008", "S-1010", "S-1012", "S-1013"],
    }


def _location(run: PageRun) -> tuple[str, str]:
    """(code location name, repository name) of the loaded location."""
    workspace = graphql(run.port, WORKSPACE)["workspaceOrError"]
    for entry in workspace.get("locationEntries", []):
        loaded = entry["locationOrLoadError"] or {}
        if loaded.get("__typename") == "RepositoryLocation":
            return entry["name"], loaded["repositories"][0]["name"]
    raise AssertionError(f"no loaded code location: {workspace}")


def tutorial_sensors(run: PageRun) -> None:
    """What the tutorial's reader clicks under Automation: the continuous sensor on. The
    file of 2026-03-03 the page just wrote is read by the continuous run within the time the
    page promises; then the sensor goes off again and the run is terminated (what the run
    modes how-to says to do)."""
    repositories = _repositories(run)
    assert repositories is not None
    states = {
        sensor["name"]: sensor["sensorState"]["status"]
        for repository in repositories
        for sensor in repository["sensors"]
    }
    assert states.get("shipments_continuous") == "STOPPED", states
    assert states.get("shipments_report_completions") == "RUNNING", states
    location, repository = _location(run)
    selector = {
        "repositoryLocationName": location,
        "repositoryName": repository,
        "sensorName": "shipments_continuous",
    }
    started = graphql(run.port, START_SENSOR, {"sensorSelector": selector})["startSensor"]
    assert started["__typename"] == "Sensor", started
    day = run.cwd / "data" / "warehouse" / "shipments_by_day" / "dt=2026-03-03"

    def landed() -> list[str] | None:
        if not any(day.glob("*.parquet")):
            return None
        ids = ds.dataset(day, format="parquet").to_table().column("shipment_id").to_pylist()
        return ids or None

    ids = _until(run, "the continuous run wrote 2026-03-03", CONTINUOUS_TIMEOUT, landed)
    assert ids == ["S-1014"], ids  # exactly once
    stopped = graphql(run.port, STOP_SENSOR, {"id": started["sensorState"]["id"]})
    assert stopped["stopSensor"]["__typename"] == "StopSensorMutationResult", stopped
    runs = graphql(run.port, LIVE_RUNS, {"job": "shipments_continuous"})["runsOrError"]
    for live in runs["results"]:
        done = graphql(run.port, TERMINATE_RUN, {"runId": live["runId"]})["terminateRun"]
        assert done["__typename"] == "TerminateRunSuccess", done


def stop_dagster(run: PageRun) -> None:
    """What Ctrl+C does: stop the page's background processes."""
    stop_background(run)
    run.background.clear()


CHECKS.update(
    tutorial_backfill=tutorial_backfill,
    tutorial_sensors=tutorial_sensors,
    stop_background=stop_dagster,
)
