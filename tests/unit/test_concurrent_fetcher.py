"""The split fetcher of a reader that reads all its splits at once (``concurrent``, stream
sources): every pulled split joins the reader at once, a continuous fetcher keeps pulling
while its reader holds unbounded splits (a partition found later is not starved), and a
bounded one ends when its reader and the store have nothing left."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from enumerator_service import SplitAssignment, StreamSplit
from spark_jobs.source import HandoffQueue, RecordsWithSplitIds, SplitFetcher


def _assignment(split_id: int, end: int | None) -> SplitAssignment:
    split = StreamSplit("s", "kafka", f"t/{split_id}", 0, end)
    return SplitAssignment(split_id, split, 1, 0)


class _Reader:
    """Holds splits; a bounded split (end set) finishes at its first fetch, an unbounded one
    never."""

    def __init__(self) -> None:
        self.held: dict[int, SplitAssignment] = {}
        self.added: list[int] = []
        self.lock = threading.Lock()

    def add_split(self, assignment: SplitAssignment) -> None:
        with self.lock:
            self.held[assignment.split_id] = assignment
            self.added.append(assignment.split_id)

    def has_splits(self) -> bool:
        return bool(self.held)

    def fetch(self) -> RecordsWithSplitIds:
        time.sleep(0.01)
        with self.lock:
            done = [i for i, a in self.held.items() if a.split.end is not None]
            for split_id in done:
                del self.held[split_id]
        return RecordsWithSplitIds(finished=done)

    def wake_up(self) -> None: ...
    def close(self) -> None: ...


class _Store:
    """Hands out one split per request from a queue the test fills."""

    def __init__(self, splits: Sequence[SplitAssignment]) -> None:
        self.queue = list(splits)
        self.lock = threading.Lock()

    def request(self) -> list[SplitAssignment]:
        with self.lock:
            return [self.queue.pop(0)] if self.queue else []


def _drain(handoff: HandoffQueue, until: float) -> list[RecordsWithSplitIds]:
    out = []
    while time.monotonic() < until:
        item = handoff.poll()
        if item is None:
            time.sleep(0.005)
            continue
        assert not isinstance(item, BaseException), item
        out.append(item)
        if item.end_of_input:
            break
    return out


def test_a_bounded_concurrent_fetcher_adds_every_split_at_once_and_ends() -> None:
    reader, store = _Reader(), _Store([_assignment(i, 10) for i in range(1, 5)])
    handoff = HandoffQueue(capacity=100)
    fetcher = SplitFetcher(reader, handoff, store.request, [], concurrent=True)
    fetcher.start()
    items = _drain(handoff, time.monotonic() + 5)
    fetcher.shutdown()
    assert [a.split_id for a in items[0].added] == [1, 2, 3, 4]  # all four in one fetch
    assert sorted(i for item in items for i in item.finished) == [1, 2, 3, 4]
    assert items[-1].end_of_input


def test_a_continuous_concurrent_fetcher_adds_splits_while_it_reads_unbounded_ones() -> None:
    reader, store = _Reader(), _Store([_assignment(1, None), _assignment(2, None)])
    handoff = HandoffQueue(capacity=1000)
    fetcher = SplitFetcher(
        reader, handoff, store.request, [], poll_interval=0.05, idle_exit=None, concurrent=True
    )
    fetcher.start()
    items = _drain(handoff, time.monotonic() + 0.3)
    assert reader.added == [1, 2]  # both unbounded splits held at once
    with store.lock:
        store.queue.append(_assignment(3, None))  # a partition found later
    items += _drain(handoff, time.monotonic() + 0.5)
    fetcher.shutdown()
    assert reader.added == [1, 2, 3]
    assert [a.split_id for item in items for a in item.added] == [1, 2, 3]
    assert not any(item.end_of_input for item in items)


def test_a_restored_split_does_not_hold_back_the_others() -> None:
    reader, store = _Reader(), _Store([_assignment(2, 10)])
    handoff = HandoffQueue(capacity=100)
    fetcher = SplitFetcher(reader, handoff, store.request, [_assignment(1, None)], concurrent=True)
    fetcher.start()
    items = _drain(handoff, time.monotonic() + 0.3)
    fetcher.shutdown()
    # Bounded: the unbounded restored split never ends, yet split 2 was pulled and read.
    assert reader.added == [1, 2]
    assert 2 in [i for item in items for i in item.finished]
