"""``bench/e2e.py``: the object-store rows of issue 22 (``--skip s3``, ``--skip discovery``).

- **Sluice on S3**: the clickstream run at L = 0 with its landing and its warehouse on a local
  S3-protocol server — moto's (the tests' server, ``tests/s3_server.py``), run as
  ``moto_server`` in a process of its own on 127.0.0.1, as a store would be, and started
  before the Spark session: its workers take the fake credentials from the environment they
  start with (the standard AWS chain); the endpoint travels as ``SLUICE_S3_ENDPOINT_URL``.
  The bench's files are uploaded once to ``s3://<bucket>/landing/`` (same keys under the
  landing); each run's output goes to ``s3://<bucket>/warehouse/<source>`` and is deleted
  after it. It runs in the interleaved rounds, after an unmeasured run of its own; its rate
  over the local-disk Sluice L = 0 row of the same invocation: target >= 0.7x.
- **Discovery of 100,000 objects** under one prefix (``--discovery-objects``; 10,000 with
  ``--quick``): ``bench/s3_discovery.py``'s measurement (its own moto server in this process,
  the objects put straight into moto's backend, moto's listing made linear): the listing a
  discovery tick does (``ObjectLanding.data_files``) against a bare ``pyarrow.fs`` listing
  of the same prefix, best of 3 interleaved runs of each; target >= 0.5x the bare rate. It
  runs after the Sluice rows (the server's objects are frozen out of the collector while it
  lasts, then dropped).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from _e2e_common import (
    TARGET_DISCOVERY_VS_LISTING,
    TARGET_S3_VS_LOCAL,
    Context,
    Result,
    console,
)
from _e2e_sluice import run_sluice
from _harness import verdict_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # s3_server

S3_LABEL = "Sluice, landing + warehouse on S3 (moto, 127.0.0.1)"


@dataclass(frozen=True)
class S3Landing:
    """The bench's files on the server (``landing``) and where outputs go (``warehouse``)."""

    landing: str
    warehouse: str
    seconds: float  # the upload's


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def s3_landing(ctx: Context) -> Iterator[S3Landing]:
    """Start ``moto_server`` on 127.0.0.1, put its settings and the fake credentials in
    ``os.environ`` (restored after), upload the bench's files once; stop it at the end."""
    from s3_server import S3Server

    port = _free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    s3 = S3Server(port, None)  # its env, admin client and buckets; the process is ours
    saved = {key: os.environ.get(key) for key in s3.env}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start ({server.poll()})") from None
                time.sleep(0.2)
        os.environ.update(s3.env)
        bucket = f"bench-e2e-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        fs = s3.admin()
        began = time.perf_counter()
        for path in ctx.files:
            key = f"{bucket}/landing/{path.relative_to(ctx.landing).as_posix()}"
            with fs.open_output_stream(key) as out:
                out.write(path.read_bytes())
        uploaded = time.perf_counter() - began
        console.print(
            f"S3: moto_server on {s3.endpoint_url}, {len(ctx.files)} files uploaded to "
            f"s3://{bucket}/landing in {uploaded:.1f} s"
        )
        yield S3Landing(f"s3://{bucket}/landing", f"s3://{bucket}/warehouse", uploaded)
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def s3_plans(ctx: Context, s3: S3Landing) -> list[tuple[str, Callable[[], Result]]]:
    """(label, run) of the S3 row (its label does not start with "Sluice": it gets a warm-up
    run of its own, like the small runs)."""
    return [
        (
            "s3: Sluice, landing + warehouse on S3, L=0 ms",
            lambda: run_sluice(
                ctx, 0.0, s3.landing, S3_LABEL, kind="sluice-s3", warehouse=s3.warehouse
            ),
        )
    ]


def run_discovery(ctx: Context, repeat: int = 3) -> list[Result]:
    """The bare listing's and discovery's rows (objects/s), from ``bench/s3_discovery.py``."""
    from s3_discovery import measure

    objects = ctx.args.discovery_objects
    with console.status(f"Discovery of {objects:,} objects on S3 vs a bare listing…"):
        m = measure(objects, repeat)
    note = f"best of {repeat} interleaved; peak Python memory {{:.1f}} MB; moto in this process"
    found = [
        Result(
            None,
            "discovery-bare",
            f"bare pyarrow.fs listing of {objects:,} objects (S3, one prefix)",
            objects,
            m.bare_seconds,
            objects / m.bare_seconds,
            note=note.format(m.bare_peak / 1e6),
        ),
        Result(
            None,
            "discovery",
            f"Sluice discovery listing of the same {objects:,} objects",
            objects,
            m.discovery_seconds,
            objects / m.discovery_seconds,
            note=note.format(m.discovery_peak / 1e6),
        ),
    ]
    for r in found:
        console.print(f"{r.variant}: {r.rate:,.0f} objects/s, {r.seconds:.2f} s; {r.note}")
    return found


def s3_verdicts(results: list[Result]) -> list[str]:
    def find(kind: str, latency: float | None) -> Result | None:
        return next((r for r in results if r.kind == kind and r.latency_ms == latency), None)

    lines = []
    local, s3 = find("sluice", 0.0), find("sluice-s3", 0.0)
    if local and s3:
        ratio = s3.rate / local.rate
        lines.append(
            verdict_line(
                ratio >= TARGET_S3_VS_LOCAL,
                f"L=0: Sluice with landing + warehouse on S3 {s3.rate:,.0f} events/s = "
                f"{ratio:.2f}x the local-disk {local.rate:,.0f} events/s (target >= "
                f"{TARGET_S3_VS_LOCAL:g}x; medians of this invocation)",
            )
        )
    else:
        lines.append(verdict_line(None, "L=0: Sluice on S3 vs on local disk (not measured)"))
    bare, discovery = find("discovery-bare", None), find("discovery", None)
    if bare and discovery:
        ratio = discovery.rate / bare.rate
        lines.append(
            verdict_line(
                ratio >= TARGET_DISCOVERY_VS_LISTING,
                f"discovery of {discovery.events:,} S3 objects: {discovery.rate:,.0f} "
                f"objects/s = {ratio:.2f}x a bare pyarrow.fs listing's {bare.rate:,.0f} "
                f"(target >= {TARGET_DISCOVERY_VS_LISTING:g}x; best of this invocation)",
            )
        )
    else:
        lines.append(verdict_line(None, "discovery of S3 objects vs a bare listing (not measured)"))
    return lines
