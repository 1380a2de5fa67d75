"""Discovery of 100,000 objects under one S3 prefix vs a bare ``pyarrow.fs`` listing of it.

    python bench/s3_discovery.py [--objects 100000] [--repeat 3] [--tick]

Starts the tests' S3 server (moto on 127.0.0.1, ``tests/s3_server.py``), puts ``--objects``
empty ``.jsonl`` objects under ``s3://<bucket>/landing/dt=2025-01-01/`` straight into moto's
in-process backend (fast: no HTTP, no multipart), with Last-Modified times spread over the
past, and times, through pyarrow's real S3 client over HTTP:

a. *bare*: ``fs.get_file_info(FileSelector(<the dt= prefix>))`` — the listing alone;
b. *discovery*: what a discovery tick does with the store — ``ObjectLanding.data_files``:
   the landing's ``dt=`` prefixes, then the listing of each, names to kinds, identities.

moto's own ``ListObjectsV2`` rescans and sorts the whole bucket for every page of 1,000 keys
(quadratic: 10,000 objects took 113 s to list here, 100,000 would take hours) and builds
each page's XML through its generic serializer (~1.5 ms per key), which no real store does.
The bench replaces those two pieces (the server runs in this process) with a bisect over a
sorted index of the bucket's keys and a direct rendering of the same XML document (same
pages, tokens, common prefixes and fields); the HTTP server and pyarrow's S3 client are the
real ones of the tests. Both timings run against the same server, so the ratio measures
what discovery adds to the listing itself.

Each is the best of ``--repeat`` interleaved runs; the ratio of the rates (discovery / bare,
target >= 0.5) is printed last, with the peak Python memory (tracemalloc) of each: the
listing is held one prefix at a time, so memory grows with the largest prefix, not with the
landing. ``--tick`` also
times two ``ContinuousFileEnumerator.discover()`` ticks on the platform database of
``load_settings()`` (the embedded Postgres by default): the first registers every object,
the second (nothing new) is the steady-state tick; their split rows are removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pyarrow.fs as pafs
from _e2e_common import TARGET_DISCOVERY_VS_LISTING as TARGET
from s3_server import REGION, s3_server

from enumerator_service._object_landing import ObjectLanding
from enumerator_service._storage import StorageOptions, open_location

T = TypeVar("T")
DAY = "2025-01-01"


_patched: list[bool] = []


def fast_listing() -> None:
    """Patch moto's ``list_objects_v2`` with a linear-time equivalent (module docstring);
    once per process."""
    if _patched:
        return
    _patched.append(True)
    from bisect import bisect_left, bisect_right

    from moto.s3.models import S3Backend
    from moto.utilities.utils import md5_hash

    index: dict[int, tuple[int, list[str]]] = {}

    def names_of(bucket: Any) -> list[str]:
        known = index.get(id(bucket))
        if known is None or known[0] != len(bucket.keys):
            known = (len(bucket.keys), sorted(bucket.keys.keys()))
            index[id(bucket)] = known
        return known[1]

    def list_objects_v2(
        self: Any,
        bucket: Any,
        prefix: str | None,
        delimiter: str | None,
        continuation_token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> tuple[list[Any], bool, str | None]:
        names, prefix = names_of(bucket), prefix or ""
        after = self._pagination_tokens.get(continuation_token) if continuation_token else None
        after = after or start_after
        at = bisect_left(names, prefix)
        if after:
            at = max(at, bisect_right(names, after))
        found: list[Any] = []
        while at < len(names) and names[at].startswith(prefix):
            if len(found) == max_keys:
                item = found[-1]
                last = item if isinstance(item, str) else item.name
                token = md5_hash(last.encode("utf-8")).hexdigest()
                self._pagination_tokens[token] = last
                return found, True, token
            rest = names[at][len(prefix) :]
            if delimiter and delimiter in rest:
                folder = prefix + rest.split(delimiter)[0] + delimiter
                found.append(folder)
                at = bisect_left(names, folder + "\U0010ffff")  # past the whole folder
                continue
            found.append(bucket.keys[names[at]])
            at += 1
        return found, False, None

    S3Backend.list_objects_v2 = list_objects_v2  # type: ignore[method-assign]

    from xml.sax.saxutils import escape

    from moto.s3.responses import S3Response

    serialized = S3Response.serialized

    def fast_serialized(self: Any, action_result: Any) -> Any:
        result = action_result.result
        if self.data.get("Action") != "ListObjectsV2" or not isinstance(result, dict):
            return serialized(self, action_result)
        parts = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>{escape(result['Name'])}</Name><Prefix>{escape(result['Prefix'])}</Prefix>",
            f"<MaxKeys>{result['MaxKeys']}</MaxKeys><KeyCount>{result['KeyCount']}</KeyCount>",
            f"<IsTruncated>{str(result['IsTruncated']).lower()}</IsTruncated>",
        ]
        for name in ("Delimiter", "EncodingType", "NextContinuationToken", "StartAfter"):
            if name in result:
                parts.append(f"<{name}>{escape(str(result[name]))}</{name}>")
        for item in result["Contents"]:
            parts.append(
                f"<Contents><Key>{escape(item['Key'])}</Key>"
                f"<LastModified>{item['LastModified']}</LastModified>"
                f"<ETag>{escape(item['ETag'])}</ETag><Size>{item['Size']}</Size>"
                f"<StorageClass>{item['StorageClass']}</StorageClass></Contents>"
            )
        for folder in result.get("CommonPrefixes", []):
            parts.append(
                f"<CommonPrefixes><Prefix>{escape(folder['Prefix'])}</Prefix></CommonPrefixes>"
            )
        parts.append("</ListBucketResult>")
        headers = {"Content-Type": "application/xml", **self.response_headers}
        return 200, headers, "".join(parts)

    S3Response.serialized = fast_serialized  # type: ignore[method-assign]


def populate(bucket: str, objects: int) -> None:
    """``objects`` empty objects in moto's in-process backend, one a second in the past."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    start = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=objects + 3600)
    for i in range(objects):
        key = backend.put_object(bucket, f"landing/dt={DAY}/part-{i:07d}.jsonl", b"")
        key.last_modified = start + timedelta(seconds=i)


def best_of(repeat: int, works: dict[str, Callable[[], int]]) -> dict[str, tuple[float, int]]:
    """Best seconds and result of each of ``works`` over ``repeat`` rounds, interleaved (one
    run of each per round: a busy moment of a shared machine hits both alike)."""
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeat):
        for name, work in works.items():
            began = time.perf_counter()
            result = work()
            seconds = time.perf_counter() - began
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, result)
    return best


def peak_memory(work: Callable[[], int]) -> int:
    """Peak Python memory of one run of ``work`` under tracemalloc (not timed: it slows
    Python down; the in-process server's allocations for the requests count too)."""
    tracemalloc.start()
    work()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def ticks(location: Any, objects: int, bare_seconds: float) -> None:
    """Two discovery ticks on Postgres (see the module docstring)."""
    import sqlalchemy as sa

    from enumerator_service import ContinuousFileEnumerator, load_settings
    from enumerator_service._operations import open_platform
    from enumerator_service._schema import enumerator_state, splits

    settings = load_settings()
    platform = open_platform(settings)
    source = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        for name in ("first tick (registers all)", "next tick (nothing new)"):
            enumerator = ContinuousFileEnumerator(
                platform.engine, source, location, lookback_seconds=600.0
            )
            began = time.perf_counter()
            result = enumerator.discover()
            seconds = time.perf_counter() - began
            print(
                f"{name:<28} {seconds:8.2f} s  {objects / seconds:10,.0f} objects/s  "
                f"{bare_seconds / seconds:.2f}x the bare listing ({result.splits_registered:,} "
                f"splits registered, cursor {len(result.cursor.get('recent_paths', [])):,} "
                "recent keys)"
            )
    finally:
        with platform.engine.begin() as conn:
            conn.execute(sa.delete(splits).where(splits.c.source == source))
            conn.execute(sa.delete(enumerator_state).where(enumerator_state.c.source == source))
        platform.close()


@dataclass(frozen=True)
class Measured:
    """Best-of timings of the bare listing and of discovery over ``objects`` objects, with
    the peak Python memory of one run of each."""

    objects: int
    bare_seconds: float
    discovery_seconds: float
    bare_peak: int
    discovery_peak: int

    @property
    def ratio(self) -> float:
        """Discovery's rate over the bare listing's (target >= ``TARGET``)."""
        return self.bare_seconds / self.discovery_seconds


def measure(objects: int, repeat: int, tick: bool = False) -> Measured:
    """Start the server, populate it, time both listings (and the ticks), stop it; the
    server's objects are dropped and the collector unfrozen before returning."""
    fast_listing()
    with s3_server() as s3:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        began = time.perf_counter()
        populate(bucket, objects)
        # The server's 100,000s of objects live in this process: out of the collector's
        # reach, as they would be in a store's own process (else every collection the
        # client's allocations trigger walks them).
        gc.freeze()
        try:
            print(f"populated {objects:,} objects in {time.perf_counter() - began:.1f} s")
            options = StorageOptions(s3.endpoint_url, REGION)
            location = open_location(f"s3://{bucket}/landing", options)
            prefix = f"{location.path}/dt={DAY}"
            selector = pafs.FileSelector(prefix, recursive=False)

            def bare() -> int:
                return len(location.fs.get_file_info(selector))

            def discovery() -> int:
                landing = ObjectLanding(location)
                return sum(1 for _ in landing.data_files(partitioned=True, dates=None))

            best = best_of(repeat, {"bare": bare, "discovery": discovery})
            (bare_s, bare_n), (disc_s, disc_n) = best["bare"], best["discovery"]
            assert bare_n == disc_n == objects, (bare_n, disc_n)
            measured = Measured(objects, bare_s, disc_s, peak_memory(bare), peak_memory(discovery))
            if tick:
                ticks(location, objects, bare_s)
        finally:
            forget_bucket(bucket)
            gc.unfreeze()
    return measured


def forget_bucket(bucket: str) -> None:
    """Drop the bucket from moto's in-process backend (its objects with it)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets.pop(bucket, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tick", action="store_true", help="also time discovery ticks")
    args = parser.parse_args()
    m = measure(args.objects, args.repeat, args.tick)
    print(
        f"bare pyarrow.fs listing     {m.bare_seconds:8.2f} s  "
        f"{m.objects / m.bare_seconds:10,.0f} objects/s"
        f"  peak Python memory {m.bare_peak / 1e6:6.1f} MB"
    )
    print(
        f"discovery listing           {m.discovery_seconds:8.2f} s  "
        f"{m.objects / m.discovery_seconds:10,.0f} objects/s"
        f"  peak Python memory {m.discovery_peak / 1e6:6.1f} MB"
    )
    verdict = "ok" if m.ratio >= TARGET else "MISS"
    print(f"ratio discovery / bare listing: {m.ratio:.2f}x (target >= {TARGET}x) {verdict}")


if __name__ == "__main__":
    main()
