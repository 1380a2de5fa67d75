"""Checkpoint barrier alignment and tracking, ported from Flink's BarrierBufferTest and
(CheckpointBarrier)BarrierTrackerTest.

A scenario is a sequence of events; a data element is identified by its index in the
sequence. The harness feeds every event, drains ``release()`` after each, and logs emitted
elements interleaved with ``("cp", n)`` / ``("abort", n)`` callbacks. Flink's tests also hand
end-of-partition events through ``getNextNonBlocked``; our handlers do not emit them, so they
are dropped from the expected orders.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from spark_jobs.checkpoint import (
    MAX_CHECKPOINTS_TO_TRACK,
    AbortReason,
    AlignedBarrierHandler,
    BarrierTracker,
    StreamCorruptError,
)

Event = tuple[str, int, int]  # kind, channel, checkpoint id
Note = tuple[str, int]
Log = list[int | Note]


def buf(ch: int) -> Event:
    return ("buf", ch, -1)


def bar(cid: int, ch: int) -> Event:
    return ("bar", ch, cid)


def cancel(cid: int, ch: int) -> Event:
    return ("cancel", ch, cid)


def eop(ch: int) -> Event:
    return ("eop", ch, -1)


Handler = AlignedBarrierHandler[int] | BarrierTracker[int]


def feed(handler: Handler, seq: Sequence[Event], log: Log, start: int = 0) -> None:
    for i, (kind, ch, cid) in enumerate(seq, start):
        if kind == "buf":
            log.extend(handler.process_element(ch, i))
        elif kind == "bar":
            log.extend(handler.process_barrier(ch, cid))
        elif kind == "cancel":
            log.extend(handler.process_cancellation(ch, cid))
        else:
            log.extend(handler.process_end_of_partition(ch))
        while isinstance(handler, AlignedBarrierHandler) and handler.has_pending:
            log.extend(handler.release())


def run(kind: str, channels: int, seq: Sequence[Event]) -> tuple[list[int], list[Note], Log]:
    log: Log = []
    reasons: list[AbortReason] = []

    def on_abort(n: int, reason: AbortReason) -> None:
        reasons.append(reason)
        log.append(("abort", n))

    def on_checkpoint(n: int) -> None:
        log.append(("cp", n))

    handler: Handler = (
        AlignedBarrierHandler(channels, on_checkpoint, on_abort)
        if kind == "aligned"
        else BarrierTracker(channels, on_checkpoint, on_abort)
    )
    feed(handler, seq, log)
    if isinstance(handler, AlignedBarrierHandler):
        assert handler.num_buffered == 0 or handler.is_aligning
        check_snapshots(seq, log)
    elements = [x for x in log if isinstance(x, int)]
    notes = [x for x in log if not isinstance(x, int)]
    assert all(isinstance(r, AbortReason) for r in reasons)
    return elements, notes, log


def check_snapshots(seq: Sequence[Event], log: Log) -> None:
    """Exactly-once: when checkpoint n triggers, exactly the elements that precede barrier n
    on their channel (all elements of channels closed without it) have been emitted."""
    for pos, entry in enumerate(log):
        if isinstance(entry, int) or entry[0] != "cp":
            continue
        n = entry[1]
        barrier_at = {ch: i for i, (k, ch, cid) in enumerate(seq) if k == "bar" and cid == n}
        expected = {
            i
            for i, (k, ch, _) in enumerate(seq)
            if k == "buf" and (ch not in barrier_at or i < barrier_at[ch])
        }
        assert {x for x in log[:pos] if isinstance(x, int)} == expected, f"checkpoint {n}"


def buffers(seq: Sequence[Event]) -> list[int]:
    return [i for i, (k, _, _) in enumerate(seq) if k == "buf"]


def cps(*ids: int) -> list[Note]:
    return [("abort", -n) if n < 0 else ("cp", n) for n in ids]


# --------------------------------------------------------------------------------------------
# AlignedBarrierHandler: BarrierBufferTest (exact sequences and expected orders)
# --------------------------------------------------------------------------------------------


def test_aligned_single_channel_with_barriers() -> None:
    seq = [
        buf(0), buf(0), buf(0), bar(1, 0), buf(0), buf(0), buf(0), buf(0),
        bar(2, 0), bar(3, 0), buf(0), buf(0), bar(4, 0), bar(5, 0), bar(6, 0),
        buf(0), eop(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 1, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 2, 3, 4, 5, 6)


def test_aligned_multi_channel_with_barriers() -> None:
    seq = [
        # checkpoint with blocked data
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), buf(0), bar(1, 0),
        # checkpoint without blocked data
        buf(0), buf(0), buf(1), buf(1), buf(2), bar(2, 0), bar(2, 1), bar(2, 2),
        # checkpoint with data only from one channel
        buf(2), buf(2), bar(3, 2), buf(2), buf(2), bar(3, 0), bar(3, 1),
        # empty checkpoint
        bar(4, 1), bar(4, 2), bar(4, 0),
        # checkpoint with blocked data in mixed order
        buf(0), buf(2), buf(0), bar(5, 1), buf(2), buf(0), buf(2), buf(1), bar(5, 2),
        buf(1), buf(0), buf(2), buf(1), bar(5, 0),
        # some trailing data
        buf(0), eop(0), eop(1), eop(2),
    ]  # fmt: skip
    elements, notes, log = run("aligned", 3, seq)
    assert elements == [
        0, 1, 2, 7, 5, 6, 9, 10, 11, 12, 13, 17, 18, 20, 21, 27, 28, 29,
        31, 32, 33, 37, 34, 36, 38, 39, 41,
    ]  # fmt: skip
    assert notes == cps(1, 2, 3, 4, 5)
    # blocked data of channel 2 for checkpoint 1 comes after the trigger
    assert log.index(("cp", 1)) < log.index(5)


def test_aligned_multi_channel_trailing_blocked_data() -> None:
    seq = [
        buf(0), buf(1), buf(2), bar(1, 1), bar(1, 2), bar(1, 0),
        buf(2), buf(1), buf(0), bar(2, 1), buf(1), buf(1), eop(1), buf(0), buf(2),
        bar(2, 2), buf(2), eop(2), buf(0), eop(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 1, 2, 6, 7, 8, 13, 14, 18, 10, 11, 16]
    assert notes == cps(1, -2)


def test_aligned_multi_channel_with_queued_future_barriers() -> None:
    seq = [
        # checkpoint 1 - with blocked data
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), buf(0), bar(1, 0),
        buf(1), buf(0),
        # checkpoint 2 - future checkpoint barriers come before it is complete
        bar(2, 1), buf(1), buf(2), bar(2, 0), bar(3, 0), buf(0), bar(3, 1), buf(0), buf(1),
        buf(2), bar(4, 1), buf(1), buf(2),
        # complete checkpoint 2, send a barrier for checkpoints 4 and 5
        bar(2, 2), buf(2), buf(1), buf(2), buf(0), bar(4, 0), buf(2), buf(1), buf(2), buf(0),
        bar(5, 1),
        # complete checkpoint 3
        bar(3, 2), buf(2), buf(1), buf(2), buf(0), bar(6, 1),
        # complete checkpoint 4, checkpoint 5 remains not fully triggered
        bar(4, 2), buf(2), buf(1), eop(1), buf(2), eop(2), buf(0), eop(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [
        0, 1, 2, 7, 5, 6, 9, 10, 13, 20, 23, 12, 25, 27, 30, 32, 16, 18, 19, 28, 36, 38,
        22, 26, 31, 33, 39, 42, 45, 37, 47, 43,
    ]  # fmt: skip
    assert notes == cps(1, 2, 3, 4, -5, -6)


def test_aligned_multi_channel_skipping_checkpoints() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), buf(0), bar(1, 0),
        buf(1), buf(0),
        # checkpoint 2 will not complete: pre-mature barrier from checkpoint 3
        bar(2, 1), buf(1), buf(2), bar(2, 0), buf(2), buf(0), bar(3, 2),
        buf(2), buf(1), eop(1), buf(2), eop(2), buf(0), eop(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 1, 2, 7, 5, 6, 9, 10, 13, 15, 12, 16, 19, 18, 21, 23]
    assert notes == cps(1, -2, -3)


def test_aligned_multi_channel_jumping_over_checkpoint() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), buf(0), bar(1, 0),
        buf(1), buf(0),
        bar(2, 1), buf(1), buf(2), bar(2, 0), buf(2), buf(0), bar(3, 1), buf(1), buf(2),
        bar(3, 0), buf(2), buf(0), bar(4, 2),
        buf(2), buf(1), eop(1), buf(2), eop(2), buf(0), eop(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 1, 2, 7, 5, 6, 9, 10, 13, 15, 19, 21, 12, 16, 18, 22, 25, 24, 27, 29]
    # 2 is subsumed by 4; the queued barriers of 3 are older than 4 and ignored; 4 ends by EOP
    assert notes == cps(1, -2, -4)


def test_aligned_multi_channel_skipping_checkpoints_via_blocked_inputs() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), buf(0), bar(1, 0),
        buf(1), buf(0),
        bar(2, 1), buf(1), buf(2), bar(2, 0), buf(1), buf(0),
        bar(3, 0),  # queued barrier on blocked input
        buf(0),
        bar(4, 1),  # pre-mature barrier on blocked input
        buf(1), buf(0), buf(2),
        bar(2, 2),  # complete checkpoint 2
        buf(0),
        bar(3, 2),  # ignored
        buf(2), bar(4, 0), buf(0), buf(1), buf(2), bar(4, 2),
        buf(1), eop(1), buf(2), eop(2), buf(0), eop(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [
        0, 1, 2, 7, 5, 6, 9, 10, 13, 22, 12, 15, 16, 18, 21, 24, 26, 30, 20, 28, 29,
        32, 34, 36,
    ]  # fmt: skip
    assert notes == cps(1, 2, -3, 4)


def test_aligned_start_alignment_with_closed_channels() -> None:
    seq = [
        eop(2), eop(1),  # close some channels immediately
        buf(0), buf(0), buf(3), bar(2, 3), bar(2, 0),
        buf(3), buf(0), bar(3, 3), buf(3), buf(0), bar(3, 0),
        bar(4, 0), bar(4, 3),
        buf(0), buf(0), buf(3), eop(0),
        buf(3), bar(5, 3), buf(3), eop(3),  # checkpoint on the last remaining channel
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 4, seq)
    assert elements == [2, 3, 4, 7, 8, 11, 10, 15, 16, 17, 19, 21]
    assert notes == cps(2, 3, 4, 5)


def test_aligned_end_of_stream_while_checkpoint() -> None:
    seq = [
        bar(1, 0), bar(1, 1), bar(1, 2),
        buf(0), buf(0), buf(2),
        bar(2, 2), bar(2, 0), buf(0), buf(2), buf(1),  # checkpoint 2 will be incomplete
        eop(2), eop(1),  # close one after the barrier, one before
        buf(0), eop(0),
    ]  # fmt: skip
    log: Log = []
    handler = AlignedBarrierHandler[int](
        3, lambda n: log.append(("cp", n)), lambda n, r: log.append(("abort", n))
    )
    feed(handler, seq[:12], log)
    assert handler.is_blocked(0) and handler.is_blocked(2) and not handler.is_blocked(1)
    assert handler.num_buffered == 3  # 8, 9 and channel 2's end of partition
    # first end of partition: checkpoint 2 cannot complete; aborted and unblocked
    assert handler.process_end_of_partition(1) == [8, 9]
    assert log[-1] == ("abort", 2)
    assert not handler.is_blocked(0) and not handler.is_blocked(2)
    assert handler.has_pending and not handler.is_closed(2)  # its buffered end is queued
    assert handler.release() == []
    assert handler.is_closed(2) and not handler.has_pending
    log.extend([8, 9])
    feed(handler, seq[13:], log, start=13)
    assert [x for x in log if isinstance(x, int)] == [3, 4, 5, 10, 8, 9, 13]
    assert [x for x in log if not isinstance(x, int)] == cps(1, -2)
    assert handler.num_buffered == 0 and not handler.has_pending


def test_aligned_single_channel_abort_checkpoint() -> None:
    seq = [
        buf(0), bar(1, 0), buf(0), bar(2, 0), cancel(4, 0), bar(5, 0), buf(0),
        cancel(6, 0), buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 1, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 2, -4, 5, -6)


def test_aligned_multi_channel_abort_checkpoint() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), bar(1, 0),
        buf(0), buf(2),
        # aborted on last barrier
        bar(2, 0), bar(2, 2), buf(0), buf(2), cancel(2, 1),
        # successful checkpoint
        buf(2), buf(1), bar(3, 1), bar(3, 2), bar(3, 0),
        # abort on first barrier
        buf(0), buf(1), cancel(4, 1), bar(4, 2), buf(0), bar(4, 0),
        # another successful checkpoint
        buf(0), buf(1), buf(2), bar(5, 2), bar(5, 1), bar(5, 0), buf(0), buf(1),
        # abort multiple cancellations and a barrier after the cancellations
        cancel(6, 1), cancel(6, 2), bar(6, 0),
        buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 1, 2, 5, 6, 8, 9, 12, 13, 15, 16, 20, 21, 24, 26, 27, 28, 32, 33, 37]
    assert notes == cps(1, -2, 3, -4, 5, -6)


def test_aligned_abort_via_queued_barriers() -> None:
    seq = [
        buf(1), bar(1, 1), bar(1, 2), buf(2), buf(0), buf(1),
        cancel(2, 2), bar(2, 1),  # queued barrier and cancellation barrier
        buf(0), buf(1), buf(2),
        bar(1, 0),  # complete initial checkpoint
        buf(2), buf(1), buf(0),
        bar(2, 0),  # final barrier of aborted checkpoint
        buf(0), buf(1), buf(2),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 4, 8, 3, 5, 9, 10, 12, 13, 14, 16, 17, 18]
    assert notes == cps(1, -2)


def test_aligned_abort_while_having_queued_barriers() -> None:
    seq = [
        buf(1), bar(1, 1), buf(2), buf(0), buf(1),
        bar(2, 1),  # queued barrier
        buf(2), buf(1),
        cancel(1, 0),  # cancel the initial checkpoint
        buf(2), buf(1), buf(0),
        bar(1, 2),  # ignored: already cancelled and moved on to checkpoint 2
        buf(0), buf(1), buf(2),
        bar(2, 0), bar(2, 2),
        buf(0), buf(1), buf(2),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 2, 3, 6, 4, 9, 11, 13, 15, 7, 10, 14, 18, 19, 20]
    assert notes == cps(-1, 2)


def test_aligned_ignore_cancel_barrier_if_checkpoint_subsumed() -> None:
    seq = [
        buf(2), bar(3, 1), bar(3, 0), buf(0), buf(1), buf(2),
        bar(5, 2),  # newer barrier subsumes pending checkpoint 3
        buf(2), buf(1), buf(0),
        cancel(3, 2),  # cancellation of the already aborted checkpoint
        buf(2), buf(0), buf(1),
        bar(5, 0), bar(5, 1),
        buf(0), buf(1), buf(2),
    ]  # fmt: skip
    elements, notes, _ = run("aligned", 3, seq)
    assert elements == [0, 5, 3, 4, 8, 9, 12, 13, 7, 11, 16, 17, 18]
    assert notes == cps(-3, 5)


def test_aligned_repeated_barrier_raises() -> None:
    handler = AlignedBarrierHandler[int](2, lambda n: None, lambda n, r: None)
    handler.process_barrier(0, 1)
    assert handler.is_blocked(0)
    with pytest.raises(StreamCorruptError, match="repeated barrier"):
        handler.process_barrier(0, 1)
    with pytest.raises(StreamCorruptError, match="repeated barrier"):
        handler.process_barrier(0, 0)


def test_aligned_rejects_bad_input() -> None:
    handler = AlignedBarrierHandler[int](2, lambda n: None, lambda n, r: None)
    with pytest.raises(ValueError, match="out of range"):
        handler.process_element(2, 0)
    with pytest.raises(ValueError, match="out of range"):
        handler.is_blocked(-1)
    with pytest.raises(ValueError, match="non-negative"):
        handler.process_cancellation(0, -1)
    handler.process_end_of_partition(1)
    with pytest.raises(StreamCorruptError, match="after its end"):
        handler.process_element(1, 0)
    with pytest.raises(ValueError, match="num_channels"):
        AlignedBarrierHandler[int](0, lambda n: None, lambda n, r: None)


def test_aligned_does_not_trigger_while_returned_elements_are_undelivered() -> None:
    log: Log = []
    handler = AlignedBarrierHandler[int](
        2, lambda n: log.append(("cp", n)), lambda n, r: log.append(("abort", n))
    )
    handler.process_barrier(0, 1)
    assert handler.process_element(0, 10) == []  # blocked: buffered
    handler.process_barrier(0, 2)  # queued future barrier, buffered too
    assert handler.process_element(0, 11) == []
    assert handler.process_barrier(1, 1) == [10]  # checkpoint 1 triggers, replay stops at 2
    assert log == [("cp", 1)]
    assert handler.has_pending
    assert handler.release() == []  # barrier 2 of channel 0 starts alignment of 2
    assert handler.is_blocked(0) and handler.current_checkpoint_id == 2
    assert handler.num_buffered == 1 and not handler.has_pending
    assert handler.process_barrier(1, 2) == [11]
    assert log == [("cp", 1), ("cp", 2)]


def test_aligned_abort_reasons() -> None:
    reasons: list[tuple[int, AbortReason]] = []
    handler = AlignedBarrierHandler[int](3, lambda n: None, lambda n, r: reasons.append((n, r)))
    handler.process_barrier(0, 1)
    handler.process_barrier(1, 2)
    handler.process_cancellation(2, 3)
    handler.process_barrier(1, 4)
    handler.process_end_of_partition(2)
    assert reasons == [
        (1, AbortReason.SUBSUMED),
        (2, AbortReason.SUBSUMED),
        (3, AbortReason.CANCELLED),
        (4, AbortReason.END_OF_PARTITION),
    ]


# --------------------------------------------------------------------------------------------
# BarrierTracker: CheckpointBarrierTrackerTest (exact sequences and expected checkpoints)
# --------------------------------------------------------------------------------------------


def test_tracker_single_channel_with_barriers() -> None:
    seq = [
        buf(0), buf(0), buf(0), bar(1, 0), buf(0), buf(0), buf(0), buf(0),
        bar(2, 0), bar(3, 0), buf(0), buf(0), bar(4, 0), bar(5, 0), bar(6, 0), buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 1, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 2, 3, 4, 5, 6)


def test_tracker_single_channel_with_skipped_barriers() -> None:
    seq = [
        buf(0), bar(1, 0), buf(0), buf(0), bar(3, 0), buf(0), bar(4, 0), bar(6, 0), buf(0),
        bar(7, 0), buf(0), bar(10, 0), buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 1, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 3, 4, 6, 7, 10)


def test_tracker_multi_channel_with_barriers() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), bar(1, 0),
        buf(0), buf(0), buf(1), buf(1), buf(2), bar(2, 0), bar(2, 1), bar(2, 2),
        buf(2), buf(2), bar(3, 2), buf(2), buf(2), bar(3, 0), bar(3, 1),
        bar(4, 1), bar(4, 2), bar(4, 0),
        buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 3, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 2, 3, 4)


def test_tracker_multi_channel_skipping_checkpoints() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), bar(1, 0),
        buf(0), buf(0), buf(1), buf(1), buf(2), bar(2, 0), bar(2, 1), bar(2, 2),
        buf(2), buf(2), bar(3, 2), buf(2), buf(2),
        # jump to checkpoint 4
        bar(4, 0), buf(0), buf(1), buf(2), bar(4, 1), buf(1), bar(4, 2),
        buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 3, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 2, 4)


def test_tracker_complete_checkpoints_on_late_barriers() -> None:
    seq = [
        # checkpoint 2
        buf(1), buf(1), buf(0), buf(2), bar(2, 1), bar(2, 0), bar(2, 2),
        # incomplete checkpoint 3
        buf(1), buf(0), bar(3, 1), bar(3, 2),
        # some barriers from checkpoint 4
        buf(1), buf(0), bar(4, 2), bar(4, 1), buf(1), buf(2),
        # last barrier from checkpoint 3
        bar(3, 0),
        # complete checkpoint 4
        buf(0), bar(4, 0),
        # regular checkpoint 5
        buf(1), buf(2), bar(5, 1), buf(0), bar(5, 0), buf(1), bar(5, 2),
        # checkpoint 6 (incomplete)
        buf(1), bar(6, 1), buf(0), bar(6, 0),
        # checkpoint 7, with early barriers for checkpoints 8 and 9
        buf(1), bar(7, 1), buf(0), bar(7, 2), buf(2), bar(8, 2), buf(0), bar(8, 1),
        buf(1), bar(9, 1),
        # complete checkpoint 7, first barriers from checkpoint 10
        bar(7, 0), buf(0), bar(9, 2), buf(2), bar(10, 2),
        # complete checkpoint 8 and 9
        bar(8, 0), buf(1), buf(2), bar(9, 0),
        # trailing data
        buf(1), buf(0), buf(2),
        # complete checkpoint 10
        bar(10, 0), bar(10, 1),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 3, seq)
    assert elements == buffers(seq)
    assert notes == cps(2, 3, 4, 5, 7, 8, 9, 10)


def test_tracker_single_channel_abort_checkpoint() -> None:
    seq = [
        buf(0), bar(1, 0), buf(0), bar(2, 0), cancel(4, 0), bar(5, 0), buf(0),
        cancel(6, 0), buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 1, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, 2, -4, 5, -6)


def test_tracker_multi_channel_abort_checkpoint() -> None:
    seq = [
        buf(0), buf(2), buf(0), bar(1, 1), bar(1, 2), buf(2), buf(1), bar(1, 0),
        # aborted on last barrier
        buf(0), buf(2), bar(2, 0), bar(2, 2), buf(0), buf(2), cancel(2, 1),
        # successful checkpoint
        buf(2), buf(1), bar(3, 1), bar(3, 2), bar(3, 0),
        # abort on first barrier
        buf(0), buf(1), cancel(4, 1), bar(4, 2), buf(0), bar(4, 0),
        # another successful checkpoint
        buf(0), buf(1), buf(2), bar(5, 2), bar(5, 1), bar(5, 0),
        # abort multiple cancellations and a barrier after the cancellations
        buf(0), buf(1), cancel(6, 1), cancel(6, 2), bar(6, 0),
        buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 3, seq)
    assert elements == buffers(seq)
    assert notes == cps(1, -2, 3, -4, 5, -6)


def test_tracker_interleaved_cancellation_barriers() -> None:
    seq = [
        bar(1, 0), cancel(2, 0), cancel(1, 1), cancel(2, 1), cancel(1, 2), cancel(2, 2),
        buf(0),
    ]  # fmt: skip
    elements, notes, _ = run("tracker", 3, seq)
    assert elements == [6]
    assert notes == cps(-1, -2)  # each checkpoint aborted exactly once


def test_tracker_end_of_partition_completes_pending_checkpoints() -> None:
    log: Log = []
    tracker = BarrierTracker[int](3, lambda n: log.append(("cp", n)), lambda n, r: None)
    for ch, cid in [(0, 3), (2, 3), (0, 4), (1, 4)]:
        assert tracker.process_barrier(ch, cid) == []
    assert tracker.pending_checkpoint_ids == [3, 4] and log == []
    tracker.process_end_of_partition(1)  # channel 1 never sends 3: 3 completes, 4 not
    assert log == [("cp", 3)] and tracker.num_open_channels == 2
    tracker.process_end_of_partition(2)  # now channel 0 alone has delivered 4
    assert log == [("cp", 3), ("cp", 4)] and tracker.pending_checkpoint_ids == []
    tracker.process_barrier(0, 5)  # single open channel left: completes on arrival
    assert log[-1] == ("cp", 5)
    with pytest.raises(StreamCorruptError, match="after its end"):
        tracker.process_barrier(1, 6)


def test_tracker_drops_late_first_barriers_and_bounds_pending() -> None:
    log: Log = []
    tracker = BarrierTracker[int](2, lambda n: log.append(("cp", n)), lambda n, r: None)
    assert tracker.process_element(1, 7) == [7] and not tracker.is_blocked(1)
    for cid in range(1, 61):
        tracker.process_barrier(0, cid)
    assert len(tracker.pending_checkpoint_ids) == MAX_CHECKPOINTS_TO_TRACK
    assert tracker.pending_checkpoint_ids[0] == 11  # the oldest ten were dropped
    tracker.process_barrier(1, 5)  # not pending and older than the latest: dropped
    assert log == [] and tracker.pending_checkpoint_ids[0] == 11
    tracker.process_barrier(1, 12)  # completes 12, subsumes 11
    assert log == [("cp", 12)] and tracker.pending_checkpoint_ids[0] == 13
    with pytest.raises(StreamCorruptError, match="repeated barrier"):
        tracker.process_barrier(1, 12)
    with pytest.raises(ValueError, match="max_pending"):
        BarrierTracker[int](2, lambda n: None, lambda n, r: None, max_pending=0)


def test_tracker_cancellation_aborts_older_pending() -> None:
    reasons: list[tuple[int, AbortReason]] = []
    tracker = BarrierTracker[int](2, lambda n: None, lambda n, r: reasons.append((n, r)))
    tracker.process_barrier(0, 1)
    tracker.process_barrier(0, 2)
    tracker.process_cancellation(1, 2)
    assert reasons == [(1, AbortReason.SUBSUMED), (2, AbortReason.CANCELLED)]
    assert tracker.pending_checkpoint_ids == []  # 2 saw both channels: forgotten
