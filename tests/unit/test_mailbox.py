"""TaskMailbox / MailboxProcessor / MailboxExecutor / Suspension.

Every loop runs on a real asyncio loop (the mailbox thread) and every wait is bounded by
``asyncio.wait_for``; nothing sleeps in real time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.runtime import (
    MAX_PRIORITY,
    Mail,
    MailboxClosedError,
    MailboxController,
    MailboxProcessor,
    MailboxState,
    Suspension,
    TaskMailbox,
    WrongThreadError,
)

TIMEOUT = 5.0


def mail(name: str, priority: int = 0, log: list[str] | None = None) -> Mail:
    def action() -> None:
        if log is not None:
            log.append(name)

    return Mail(action, priority, name)


def drain(mailbox: TaskMailbox) -> list[str]:
    taken: list[str] = []
    while (m := mailbox.try_take()) is not None:
        taken.append(m.description)
    return taken


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, TIMEOUT))


async def wait_until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop (never sleeping in real time) until ``condition`` holds."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), TIMEOUT)


def in_thread(target: Callable[[], None]) -> None:
    """Run ``target`` in another thread and wait for it (it only does non-blocking work)."""
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive()


# -- TaskMailbox ordering --------------------------------------------------------------------


def test_higher_priority_first_fifo_within_priority() -> None:
    mailbox = TaskMailbox()
    for name, priority in [("a0", 0), ("b5", 5), ("c0", 0), ("d1", 1), ("e5", 5), ("f1", 1)]:
        mailbox.put(mail(name, priority))
    assert drain(mailbox) == ["b5", "e5", "d1", "f1", "a0", "c0"]
    assert not mailbox.has_mail()


@settings(database=None, deadline=None, max_examples=100)
@given(st.lists(st.integers(min_value=0, max_value=3), max_size=30))
def test_take_order_is_stable_sort_by_priority(priorities: list[int]) -> None:
    mailbox = TaskMailbox()
    names = [f"{i}@{p}" for i, p in enumerate(priorities)]
    for name, priority in zip(names, priorities, strict=True):
        mailbox.put(mail(name, priority))
    expected = [n for _, n in sorted(zip(priorities, names, strict=True), key=lambda t: -t[0])]
    assert drain(mailbox) == expected


def test_try_take_respects_min_priority() -> None:
    mailbox = TaskMailbox()
    mailbox.put(mail("low", 0))
    mailbox.put(mail("high", 7))
    assert mailbox.try_take(min_priority=8) is None
    taken = mailbox.try_take(min_priority=7)
    assert taken is not None
    assert taken.description == "high"
    assert mailbox.try_take(min_priority=1) is None
    assert drain(mailbox) == ["low"]


def test_create_batch_on_empty_mailbox_is_false() -> None:
    mailbox = TaskMailbox()
    assert mailbox.create_batch() is False
    assert mailbox.try_take() is None


def test_batched_mails_come_before_newer_mails_of_the_same_priority() -> None:
    mailbox = TaskMailbox()
    mailbox.put(mail("a0", 0))
    mailbox.put(mail("b1", 1))
    mailbox.put(mail("c0", 0))
    assert mailbox.create_batch() is True
    assert mailbox.has_mail()
    mailbox.put(mail("d0", 0))  # same priority as the batch's mails, but newer
    assert drain(mailbox) == ["b1", "a0", "c0", "d0"]


def test_higher_priority_mail_put_after_batch_overtakes_it() -> None:
    mailbox = TaskMailbox()
    mailbox.put(mail("x3", 3))
    mailbox.put(mail("y0", 0))
    mailbox.put(mail("z0", 0))
    assert mailbox.create_batch()
    mailbox.put(mail("urgent", MAX_PRIORITY))
    mailbox.put(mail("w3", 3))  # ties with the batch head: the older batched x3 goes first
    assert drain(mailbox) == ["urgent", "x3", "w3", "y0", "z0"]


def test_second_create_batch_keeps_priority_order() -> None:
    mailbox = TaskMailbox()
    mailbox.put(mail("low", 0))
    assert mailbox.create_batch()
    mailbox.put(mail("high", 5))
    assert mailbox.create_batch()  # the batch still holds "low"
    assert drain(mailbox) == ["high", "low"]


def test_negative_priority_mail_neither_lost_nor_blocking_later_mails() -> None:
    """A mail below DEFAULT_PRIORITY must either be rejected or eventually run; it must never
    hold back the default-priority mails posted after it."""
    log: list[str] = []
    calls: list[None] = []

    def default_action(controller: MailboxController) -> None:
        calls.append(None)
        if len(calls) == 1:
            processor.executor(0).execute(lambda: log.append("later"), "later")
        done = "later" in log and (rejected or "negative" in log)
        if done or len(calls) >= 50:  # bounded: the loop never suspends, so it cannot hang
            controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    try:
        processor.executor(-1).execute(lambda: log.append("negative"), "negative")
        rejected = False
    except ValueError:
        rejected = True
    processor.executor(0).execute(lambda: log.append("first"), "first")
    run(processor.run_loop())
    assert log[:2] == ["first", "later"]
    assert sorted(log) == sorted(["first", "later", *([] if rejected else ["negative"])])


# -- close / quiesce -------------------------------------------------------------------------


def test_put_after_close_raises_and_close_returns_dropped_mails() -> None:
    mailbox = TaskMailbox()
    mailbox.put(mail("a0", 0))
    mailbox.put(mail("b2", 2))
    mailbox.create_batch()
    mailbox.put(mail("c9", 9))
    dropped = mailbox.close()
    assert [m.description for m in dropped] == ["b2", "a0", "c9"]
    assert mailbox.state is MailboxState.CLOSED
    assert not mailbox.has_mail()
    with pytest.raises(MailboxClosedError):
        mailbox.put(mail("late", 0))


def test_put_after_quiesce_raises_but_queued_mails_still_run() -> None:
    mailbox = TaskMailbox()
    mailbox.put(mail("queued", 0))
    mailbox.quiesce()
    assert mailbox.state is MailboxState.QUIESCED
    with pytest.raises(MailboxClosedError):
        mailbox.put(mail("late", 0))
    assert drain(mailbox) == ["queued"]


def test_mailbox_is_quiesced_after_run_loop_ends() -> None:
    def default_action(controller: MailboxController) -> None:
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    run(processor.run_loop())
    assert processor.mailbox.state is MailboxState.QUIESCED
    with pytest.raises(MailboxClosedError):
        processor.executor().execute(lambda: None, "too late")


# -- MailboxProcessor ------------------------------------------------------------------------


def test_mails_run_before_default_action_in_priority_order() -> None:
    log: list[str] = []

    def default_action(controller: MailboxController) -> None:
        log.append("default")
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.executor(0).execute(lambda: log.append("low"), "low")
    processor.executor(5).execute(lambda: log.append("high"), "high")
    run(processor.run_loop())
    assert log == ["high", "low", "default"]


def test_all_actions_completed_still_runs_mails_already_queued() -> None:
    log: list[str] = []

    def default_action(controller: MailboxController) -> None:
        log.append("default")
        processor.executor().execute(lambda: log.append("queued"), "queued")
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    run(processor.run_loop())
    assert log == ["default", "queued"]


def test_put_from_another_thread_wakes_suspended_loop() -> None:
    log: list[str] = []
    suspended = threading.Event()

    def default_action(controller: MailboxController) -> None:
        log.append("default")
        controller.suspend_default_action()
        suspended.set()

    processor = MailboxProcessor(default_action)

    def finish() -> None:
        log.append("mail")
        processor.all_actions_completed()

    def poster() -> None:
        # The loop is parked (or about to park) waiting for a mail when this put arrives.
        if suspended.wait(TIMEOUT):
            processor.executor().execute(finish, "finish from another thread")

    thread = threading.Thread(target=poster)
    started = time.monotonic()
    thread.start()
    try:
        run(processor.run_loop())
    finally:
        thread.join(TIMEOUT)
    # A put that does not wake the selector would only be noticed when the next timer (the
    # TIMEOUT guard) fires; the wake-up must be immediate instead.
    assert time.monotonic() - started < TIMEOUT / 2
    assert log == ["default", "mail"]


def test_suspended_default_action_is_not_called_until_resumed() -> None:
    calls: list[int] = []
    suspensions: list[Suspension] = []

    def default_action(controller: MailboxController) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            suspensions.append(controller.suspend_default_action())
        else:
            controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    mails_run: list[int] = []

    async def main() -> None:
        task = asyncio.ensure_future(processor.run_loop())
        await wait_until(lambda: processor.is_default_action_suspended)
        for i in range(3):
            processor.executor().execute(lambda i=i: mails_run.append(i), f"mail {i}")
        await wait_until(lambda: len(mails_run) == 3)
        assert calls == [0]  # mails ran, the suspended default action did not

        def resume_on_mailbox_thread() -> None:
            suspensions[0].resume()
            # On the mailbox thread the resume is immediate: no extra mail.
            assert not processor.is_default_action_suspended
            assert not processor.mailbox.has_mail()

        processor.executor().execute(resume_on_mailbox_thread, "resume")
        await asyncio.wait_for(task, TIMEOUT)

    run(main())
    assert calls == [0, 1]
    assert mails_run == [0, 1, 2]


def test_resume_from_foreign_thread_goes_through_a_mail() -> None:
    calls: list[int] = []
    suspensions: list[Suspension] = []
    observed: dict[str, bool] = {}

    def default_action(controller: MailboxController) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            suspensions.append(controller.suspend_default_action())
        else:
            controller.all_actions_completed()

    processor = MailboxProcessor(default_action)

    def resume_elsewhere() -> None:
        observed["is_mailbox_thread"] = processor.is_mailbox_thread()
        suspensions[0].resume()
        # The loop cannot run while the test joins this thread, so nothing has resumed yet:
        # the resume is a mail waiting in the mailbox.
        observed["still_suspended"] = processor.is_default_action_suspended
        observed["mail_queued"] = processor.mailbox.has_mail()

    async def main() -> None:
        task = asyncio.ensure_future(processor.run_loop())
        await wait_until(lambda: processor.is_default_action_suspended)
        in_thread(resume_elsewhere)
        await asyncio.wait_for(task, TIMEOUT)

    run(main())
    assert observed == {"is_mailbox_thread": False, "still_suspended": True, "mail_queued": True}
    assert calls == [0, 1]
    assert not processor.is_default_action_suspended


def test_resume_mail_overtakes_default_priority_mails() -> None:
    log: list[str] = []
    suspensions: list[Suspension] = []

    def default_action(controller: MailboxController) -> None:
        if not suspensions:
            suspensions.append(controller.suspend_default_action())
            return
        log.append("default resumed")
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action)

    def post_then_resume() -> None:
        processor.executor().execute(lambda: log.append("ordinary mail"), "ordinary")
        suspensions[0].resume()  # posted later, but at MAX_PRIORITY

    def record_suspended() -> None:
        log.append(f"suspended={processor.is_default_action_suspended}")

    async def main() -> None:
        task = asyncio.ensure_future(processor.run_loop())
        await wait_until(lambda: processor.is_default_action_suspended)
        in_thread(post_then_resume)
        processor.executor().execute(record_suspended, "probe")
        await asyncio.wait_for(task, TIMEOUT)

    run(main())
    # The resume mail ran first, so the ordinary mail already saw the action resumed.
    assert log == ["ordinary mail", "suspended=False", "default resumed"]


def test_try_yield_runs_a_mail_from_inside_a_mail() -> None:
    log: list[str] = []

    def outer() -> None:
        log.append("outer start")
        executor = processor.executor()
        executor.execute(lambda: log.append("inner"), "inner")
        assert executor.try_yield() is True
        assert executor.try_yield() is False  # nothing left
        log.append("outer end")

    def default_action(controller: MailboxController) -> None:
        log.append("default")
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.executor().execute(outer, "outer")
    run(processor.run_loop())
    assert log == ["outer start", "inner", "outer end", "default"]


def test_try_yield_only_runs_mails_of_at_least_its_priority() -> None:
    log: list[str] = []

    def outer() -> None:
        processor.executor(0).execute(lambda: log.append("low"), "low")
        processor.executor(5).execute(lambda: log.append("high"), "high")
        high = processor.executor(5)
        assert high.try_yield() is True  # runs "high"
        assert high.try_yield() is False  # "low" is below priority 5
        log.append("outer end")

    def default_action(controller: MailboxController) -> None:
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action)
    processor.executor().execute(outer, "outer")
    run(processor.run_loop())
    assert log == ["high", "outer end", "low"]


def test_mailbox_thread_only_methods_raise_wrong_thread_error_elsewhere() -> None:
    outcomes: dict[str, str] = {}

    def probe() -> None:
        probes: dict[str, Callable[[], object]] = {
            "check_mailbox_thread": processor.check_mailbox_thread,
            "try_yield": processor.executor().try_yield,
            "all_actions_completed": processor.all_actions_completed,
        }
        for name, call in probes.items():
            try:
                call()
            except WrongThreadError:
                outcomes[name] = "WrongThreadError"
            else:
                outcomes[name] = "no error"

    def default_action(controller: MailboxController) -> None:
        processor.check_mailbox_thread()  # fine on the mailbox thread
        assert processor.is_mailbox_thread()
        in_thread(probe)
        controller.all_actions_completed()

    processor = MailboxProcessor(default_action, debug=True)
    run(processor.run_loop())
    assert outcomes == {
        "check_mailbox_thread": "WrongThreadError",
        "try_yield": "WrongThreadError",
        "all_actions_completed": "WrongThreadError",
    }


def test_exception_in_mail_propagates_out_of_run_loop() -> None:
    log: list[str] = []

    def boom() -> None:
        raise ValueError("mail failed")

    def default_action(controller: MailboxController) -> None:
        log.append("default")

    processor = MailboxProcessor(default_action)

    async def main() -> None:
        task = asyncio.ensure_future(processor.run_loop())
        await wait_until(lambda: len(log) >= 2)  # the default action keeps being called
        processor.executor().execute(boom, "boom")
        await asyncio.wait_for(task, TIMEOUT)

    with pytest.raises(ValueError, match="mail failed"):
        run(main())
    assert processor.mailbox.state is MailboxState.QUIESCED


def test_exception_in_default_action_propagates_out_of_run_loop() -> None:
    def default_action(controller: MailboxController) -> None:
        raise KeyError("input broken")

    processor = MailboxProcessor(default_action)
    with pytest.raises(KeyError, match="input broken"):
        run(processor.run_loop())
