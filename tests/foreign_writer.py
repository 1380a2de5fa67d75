"""Another writer of a lakehouse table as a separate OS process: the concurrent-writer tests
start it with :func:`foreign_writer` while a Sluice run commits to the same table.

The process (this file run as a script: ``python tests/foreign_writer.py <folder>``) opens
the table with the table format's own library — PyIceberg's ``SqlCatalog`` on the test's
Postgres with its own connection, or delta-rs — never with Sluice's code, and appends small
batches of its own rows in a loop, each one commit (its own data file and its own retry on
a conflicting commit), until it is told to stop. It talks to the test through files in
``<folder>``:

- ``config.json`` (written by the test): table format, table, warehouse, rows per batch,
  pause between commits, the most batches; the catalog URI, which holds the database
  password, comes in the environment (:data:`URI_VARIABLE`), never on the command line;
- ``ready``: written once its imports are done and the catalog is open;
- ``commits.jsonl``: one line per commit that landed — batch, its ids, its snapshot id (or
  Delta version), its timestamp (ms), the conflicts it retried — written AFTER the commit;
- ``race``: when it appears, the next commit is made at once (no pause), and ``raced``
  written after it (the test uses it to commit between Sluice's table load and commit);
- ``stop``: the loop ends after the commit in flight and the process exits 0. Any failure
  exits 1 with one line on stderr.

Every commit carries :data:`BATCH` in its snapshot summary / commit info, so a test finds
the foreign commits in the table's own history and compares them with ``commits.jsonl``.

Threading: the test side is used by the test's thread; the process is single-threaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

#: The environment variable that hands the catalog URI (with its password) to the process.
URI_VARIABLE = "FOREIGN_WRITER_URI"
#: The snapshot-summary / commit-info key of a foreign commit (its batch number).
BATCH = "foreign-writer.batch"
#: The day of the foreign rows (the first demo day).
DAY = date(2026, 1, 1)
#: Attempts of one batch's commit against conflicting writers before the process fails.
ATTEMPTS = 50


@dataclass
class ForeignWriter:
    """The test side of a running foreign-writer process."""

    folder: Path
    process: subprocess.Popen[bytes]

    def race(self, timeout: float = 30.0) -> dict[str, Any]:
        """Make the process commit one batch now; its commit line, once it landed."""
        (self.folder / "race").touch()
        raced = self.folder / "raced"
        deadline = time.monotonic() + timeout
        while not raced.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the foreign writer did not race: {self.stderr()}")
            time.sleep(0.005)
        line: dict[str, Any] = json.loads(raced.read_text())
        return line

    def stop(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Stop the process (it must exit 0); the lines of the commits it made."""
        (self.folder / "stop").touch()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("the foreign writer did not stop") from None
        assert code == 0, f"the foreign writer failed ({code}): {self.stderr()}"
        return self.commits()

    def commits(self) -> list[dict[str, Any]]:
        path = self.folder / "commits.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def stderr(self) -> str:
        path = self.folder / "stderr.txt"
        return path.read_text()[-2000:] if path.exists() else ""


def delta_commits(table: str, last: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(version, commitInfo) of the table's commits (the ``last`` ones), read from the log
    files themselves, oldest first."""
    files = sorted(Path(table, "_delta_log").glob("*.json"))
    found = []
    for path in files[-last:] if last else files:
        for line in path.read_bytes().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                found.append((int(path.stem), info))
    return found


def committed_ids(commits: list[dict[str, Any]]) -> Counter[str]:
    """The rows the foreign writer says it committed (from its own file)."""
    return Counter(i for c in commits for i in c["ids"])


@contextlib.contextmanager
def foreign_writer(
    folder: Path, uri: str | None = None, *, ready_timeout: float = 60.0, **config: Any
) -> Iterator[ForeignWriter]:
    """Start the process on ``config`` (``format``: "iceberg" with ``table``, ``warehouse``
    and the catalog ``uri``; "delta" with ``table`` = the table's folder; optional
    ``rows``, ``pause``, ``max_batches``), wait until it is ready; stopped (killed when it
    does not stop) when the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    env = dict(os.environ)
    if uri is not None:
        env[URI_VARIABLE] = uri
    with (folder / "stderr.txt").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, __file__, str(folder)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    writer = ForeignWriter(folder, process)
    try:
        deadline = time.monotonic() + ready_timeout
        while not (folder / "ready").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the foreign writer did not start: {writer.stderr()}")
            time.sleep(0.02)
        yield writer
    finally:
        if process.poll() is None:
            (folder / "stop").touch()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ---- the process ---------------------------------------------------------------------------

#: One batch's commit: (batch, ids) -> (snapshot id or version, timestamp ms, conflicts).
Commit = Callable[[int, list[str]], tuple[int, int, int]]


def _iceberg(config: dict[str, Any]) -> Commit:
    """Commits through PyIceberg's own SqlCatalog on the test database (own connection)."""
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow

    catalog = SqlCatalog("sluice", uri=os.environ[URI_VARIABLE], warehouse=config["warehouse"])
    name = config["table"]

    def commit(batch: int, ids: list[str]) -> tuple[int, int, int]:
        table = _wait_for(lambda: catalog.load_table(name))
        rows = _rows(schema_to_pyarrow(table.schema()), ids)
        path = f"{table.location().removeprefix('file://')}/data/foreign/{os.getpid()}-{batch}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(rows, f"{path}.parquet")
        for conflicts in range(ATTEMPTS):
            props = {BATCH: str(batch)}
            try:
                with (
                    table.transaction() as tx,
                    tx.update_snapshot(snapshot_properties=props).fast_append() as append,
                ):
                    uri = f"file://{path}.parquet"
                    append.append_data_file(
                        parquet_file_to_data_file(table.io, table.metadata, uri)
                    )
            except CommitFailedException:
                table = catalog.load_table(name)  # its own retry: reload, append again
                continue
            mine = [s for s in table.snapshots() if (s.summary or {}).get(BATCH) == str(batch)]
            return mine[0].snapshot_id, mine[0].timestamp_ms, conflicts
        raise RuntimeError(f"batch {batch}: {ATTEMPTS} conflicting commits")

    return commit


def _delta(config: dict[str, Any]) -> Commit:
    """Commits with delta-rs' ``write_deltalake(mode="append")``."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    path = config["table"]

    def commit(batch: int, ids: list[str]) -> tuple[int, int, int]:
        _wait_for(lambda: DeltaTable(path))
        schema = pa.schema(DeltaTable(path).schema().to_arrow())
        rows = _rows(schema, ids)
        props = CommitProperties(custom_metadata={BATCH: str(batch)})
        for conflicts in range(ATTEMPTS):
            try:
                write_deltalake(path, rows, mode="append", commit_properties=props)
            except CommitFailedError:
                time.sleep(0.01)
                continue  # its own retry: write again (the failed files stay unreferenced)
            # (the log itself: DeltaTable.history() can label an entry with the version
            # after its own when another writer commits while it reads)
            for version, info in reversed(delta_commits(path, last=50)):
                if info.get(BATCH) == str(batch):
                    return version, int(info["timestamp"]), conflicts
            raise RuntimeError(f"batch {batch}: committed, but not in the table's log")
        raise RuntimeError(f"batch {batch}: {ATTEMPTS} conflicting commits")

    return commit


def _rows(schema: Any, ids: list[str]) -> Any:
    """Rows with only an id and an event time (and day) of :data:`DAY`; the rest null."""
    import pyarrow as pa

    n = len(ids)
    at = datetime(DAY.year, DAY.month, DAY.day, 12, tzinfo=UTC)
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["event_id"] = pa.array(ids, schema.field("event_id").type)
    if "event_time" in schema.names:
        columns["event_time"] = pa.array([at] * n, schema.field("event_time").type)
    if "dt" in schema.names:
        columns["dt"] = pa.array([DAY] * n, schema.field("dt").type)
    return pa.table(columns, schema=schema)


def _wait_for(load: Callable[[], Any], timeout: float = 60.0) -> Any:
    """``load()`` once the table exists (a Sluice run creates it when it starts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return load()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _race_asked(folder: Path) -> bool:
    return (folder / "race").exists() and not (folder / "raced").exists()


def _pause(folder: Path, seconds: float) -> None:
    """Sleep ``seconds``, cut short by a race or stop request."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (folder / "stop").exists() or _race_asked(folder):
            return
        time.sleep(0.005)


def main(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    commit = _iceberg(config) if config["format"] == "iceberg" else _delta(config)
    (folder / "ready").touch()
    rows, pause = int(config.get("rows", 5)), float(config.get("pause", 0.1))
    batch = 0
    with (folder / "commits.jsonl").open("a") as out:
        while not (folder / "stop").exists() and batch < int(config.get("max_batches", 600)):
            racing = _race_asked(folder)
            ids = [f"foreign-{batch}-{i}" for i in range(rows)]
            found, at_ms, conflicts = commit(batch, ids)
            line = json.dumps(
                {
                    "batch": batch,
                    "ids": ids,
                    "commit": found,
                    "at_ms": at_ms,
                    "conflicts": conflicts,
                }
            )
            out.write(line + "\n")
            out.flush()
            if racing:
                (folder / "raced.tmp").write_text(line)
                (folder / "raced.tmp").rename(folder / "raced")
            batch += 1
            _pause(folder, pause)


def _redacted(text: str) -> str:
    """``text`` without the database password of the catalog URI."""
    uri = os.environ.get(URI_VARIABLE)
    if uri:
        from sqlalchemy.engine import make_url

        password = make_url(uri).password
        if password:
            text = text.replace(str(password), "***")
    return text


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except Exception as exc:
        line = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        print(f"foreign writer: {_redacted(line)}", file=sys.stderr)
        sys.exit(1)
