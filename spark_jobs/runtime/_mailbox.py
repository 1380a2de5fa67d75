"""The mailbox thread model (Flink's TaskMailbox / MailboxProcessor / MailboxExecutor).

One thread owns all operator and split state. Other threads (fetchers, committers, user thread
pools) never touch that state: they post *mails*, which the mailbox thread runs between calls
of the *default action* (input processing). In Sluice the mailbox thread is the thread running
the task's asyncio event loop, so asyncpg completions arrive on it too — and still become mails,
never direct state mutations, so an operator never re-enters itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from enum import Enum

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "Mail",
    "MailboxClosedError",
    "MailboxController",
    "MailboxExecutor",
    "MailboxProcessor",
    "MailboxState",
    "Suspension",
    "TaskMailbox",
    "WrongThreadError",
]

DEFAULT_PRIORITY = 0
#: Checkpoint triggers and notifications run ahead of everything else.
MAX_PRIORITY = 1 << 30


class MailboxClosedError(RuntimeError):
    """A mail was posted after the mailbox was closed."""


class WrongThreadError(RuntimeError):
    """A mailbox-thread-only method was called from another thread."""


class MailboxState(Enum):
    OPEN = "open"
    QUIESCED = "quiesced"  # no new mails accepted, queued ones still run
    CLOSED = "closed"


class Mail:
    """An action to run on the mailbox thread, with a priority and a description for errors."""

    __slots__ = ("action", "description", "priority")

    def __init__(self, action: Callable[[], object], priority: int, description: str) -> None:
        if priority < DEFAULT_PRIORITY:
            raise ValueError(f"mail priority must be >= {DEFAULT_PRIORITY}, got {priority}")
        self.action = action
        self.priority = priority
        self.description = description

    def run(self) -> None:
        self.action()

    def __repr__(self) -> str:
        return f"Mail({self.description!r}, priority={self.priority})"


class TaskMailbox:
    """Mails by priority, FIFO within a priority.

    ``put`` may be called from any thread and never blocks. ``try_take`` and the batch methods
    are for the mailbox thread only; ``create_batch`` moves queued mails into a thread-local
    batch so that draining them takes the lock once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[int, deque[Mail]] = {}
        self._batch: deque[Mail] = deque()
        self._size = 0
        self._state = MailboxState.OPEN
        self._on_put: Callable[[], None] | None = None
        self.mailbox_thread: int | None = None

    @property
    def state(self) -> MailboxState:
        return self._state

    def set_put_listener(self, listener: Callable[[], None] | None) -> None:
        """Called (on the posting thread) after every put, e.g. to wake the mailbox loop."""
        self._on_put = listener

    def put(self, mail: Mail) -> None:
        with self._lock:
            if self._state is not MailboxState.OPEN:
                raise MailboxClosedError(f"mailbox is {self._state.value}; dropped {mail!r}")
            queue = self._queues.get(mail.priority)
            if queue is None:
                queue = self._queues[mail.priority] = deque()
            queue.append(mail)
            self._size += 1
        listener = self._on_put
        if listener is not None:
            listener()

    def has_mail(self) -> bool:
        return bool(self._batch) or self._size > 0

    def try_take(self, min_priority: int = DEFAULT_PRIORITY) -> Mail | None:
        """The oldest mail of the highest priority ``>= min_priority``, or None. Never blocks."""
        batch_head = self._batch[0].priority if self._batch else None
        if self._size:  # unlocked read is fine: a racing put is simply seen next time
            with self._lock:
                for priority in sorted(self._queues, reverse=True):
                    if priority < min_priority:
                        break
                    queue = self._queues[priority]
                    # Batched mails are older than queued ones of the same priority.
                    if queue and (batch_head is None or priority > batch_head):
                        self._size -= 1
                        return queue.popleft()
        if batch_head is not None and batch_head >= min_priority:
            return self._batch.popleft()
        return None

    def create_batch(self) -> bool:
        """Move all queued mails into the local batch, highest priority first.

        Mails already batched are older than queued ones, so a stable sort by priority keeps
        FIFO order within each priority.
        """
        with self._lock:
            if not self._size:
                return bool(self._batch)
            merged = list(self._batch)
            for queue in self._queues.values():
                merged.extend(queue)
                queue.clear()
            self._size = 0
        merged.sort(key=lambda mail: -mail.priority)
        self._batch = deque(merged)
        return True

    def quiesce(self) -> None:
        with self._lock:
            if self._state is MailboxState.OPEN:
                self._state = MailboxState.QUIESCED

    def close(self) -> list[Mail]:
        """Close for good; returns the mails that will never run."""
        with self._lock:
            self._state = MailboxState.CLOSED
            dropped = list(self._batch)
            for priority in sorted(self._queues, reverse=True):
                dropped.extend(self._queues[priority])
            self._queues.clear()
            self._batch.clear()
            self._size = 0
        return dropped


class Suspension:
    """Handle returned by ``suspend_default_action``; ``resume`` may be called from any thread."""

    __slots__ = ("_processor", "_resumed")

    def __init__(self, processor: MailboxProcessor) -> None:
        self._processor = processor
        self._resumed = False

    def resume(self) -> None:
        if self._processor.is_mailbox_thread():
            self._resume_here()
        else:
            self._processor.executor(MAX_PRIORITY).execute(self._resume_here, "resume input")

    def _resume_here(self) -> None:
        if not self._resumed:
            self._resumed = True
            self._processor._resume(self)


class MailboxController:
    """What the default action may do to the loop that runs it."""

    __slots__ = ("_processor",)

    def __init__(self, processor: MailboxProcessor) -> None:
        self._processor = processor

    def suspend_default_action(self) -> Suspension:
        return self._processor._suspend()

    def all_actions_completed(self) -> None:
        self._processor.all_actions_completed()


class MailboxExecutor:
    """Posts mails of one priority. ``execute`` from any thread; ``try_yield`` / ``yield_`` only
    from the mailbox thread (they run other mails from inside a mail)."""

    __slots__ = ("_priority", "_processor")

    def __init__(self, processor: MailboxProcessor, priority: int) -> None:
        self._processor = processor
        self._priority = priority

    def execute(self, action: Callable[[], object], description: str = "mail") -> None:
        self._processor.mailbox.put(Mail(action, self._priority, description))

    def try_yield(self) -> bool:
        """Run one waiting mail of at least this priority; False if none. Never blocks."""
        self._processor.check_mailbox_thread()
        mail = self._processor.mailbox.try_take(self._priority)
        if mail is None:
            return False
        mail.run()
        return True

    async def yield_(self) -> None:
        """Run the next mail of at least this priority, waiting (without blocking I/O) for one."""
        while not self.try_yield():
            await self._processor._wait_for_mail()


class MailboxProcessor:
    """The task loop: run mails first, then the default action, until all actions completed.

    ``run_loop`` must be awaited on the event loop of the thread that becomes the mailbox
    thread. Between default-action calls it yields to the event loop so I/O callbacks and
    timers run; when the default action is suspended it sleeps until a mail arrives.
    With ``debug=True`` operators can call :meth:`check_mailbox_thread` on every entry.
    """

    def __init__(
        self,
        default_action: Callable[[MailboxController], None],
        mailbox: TaskMailbox | None = None,
        *,
        debug: bool = False,
    ) -> None:
        self.mailbox = mailbox or TaskMailbox()
        self.debug = debug
        self._default_action = default_action
        self._controller = MailboxController(self)
        self._suspension: Suspension | None = None
        self._running = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._thread: int | None = None

    # -- thread confinement --------------------------------------------------------------

    def is_mailbox_thread(self) -> bool:
        return threading.get_ident() == self._thread

    def check_mailbox_thread(self) -> None:
        if self._thread is not None and threading.get_ident() != self._thread:
            raise WrongThreadError("operator state touched outside the mailbox thread")

    def executor(self, priority: int = DEFAULT_PRIORITY) -> MailboxExecutor:
        return MailboxExecutor(self, priority)

    # -- controller operations (mailbox thread) ------------------------------------------

    def _suspend(self) -> Suspension:
        self.check_mailbox_thread()
        if self._suspension is None:
            self._suspension = Suspension(self)
        return self._suspension

    def _resume(self, suspension: Suspension) -> None:
        if self._suspension is suspension:
            self._suspension = None

    @property
    def is_default_action_suspended(self) -> bool:
        return self._suspension is not None

    def all_actions_completed(self) -> None:
        """End the loop once the mails already queued have run."""
        self.check_mailbox_thread()
        self._running = False
        self._wake()

    # -- the loop ------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._wakeup is None or self._loop is None:
            return
        if threading.get_ident() == self._thread:
            self._wakeup.set()
        else:
            # RuntimeError: the loop is closed, the task is over and there is nobody to wake.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wakeup.set)

    async def _wait_for_mail(self) -> None:
        assert self._wakeup is not None
        self._wakeup.clear()
        if not self.mailbox.has_mail():
            await self._wakeup.wait()

    def _process_mails(self) -> None:
        mailbox = self.mailbox
        if not mailbox.create_batch():
            return
        while True:
            mail = mailbox.try_take()
            if mail is None:
                return
            mail.run()

    async def run_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self.mailbox.mailbox_thread = self._thread
        self._wakeup = asyncio.Event()
        self.mailbox.set_put_listener(self._wake)
        try:
            while True:
                self._process_mails()
                if not self._running:
                    self._process_mails()
                    return
                if self._suspension is not None:
                    await self._wait_for_mail()
                    continue
                self._default_action(self._controller)
                # Let I/O completions and timers run before the next slice of input.
                await asyncio.sleep(0)
        finally:
            self.mailbox.set_put_listener(None)
            self.mailbox.quiesce()
