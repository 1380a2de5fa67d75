"""Mailbox thread model: one thread owns all task state; everything else posts mails."""

from spark_jobs.runtime._loop import new_event_loop, run_task
from spark_jobs.runtime._mailbox import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    Mail,
    MailboxClosedError,
    MailboxController,
    MailboxExecutor,
    MailboxProcessor,
    MailboxState,
    Suspension,
    TaskMailbox,
    WrongThreadError,
)
from spark_jobs.runtime._timers import (
    AsyncioTimerService,
    ManualTimerService,
    TimerHandle,
    TimerService,
)

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "AsyncioTimerService",
    "Mail",
    "MailboxClosedError",
    "MailboxController",
    "MailboxExecutor",
    "MailboxProcessor",
    "MailboxState",
    "ManualTimerService",
    "Suspension",
    "TaskMailbox",
    "TimerHandle",
    "TimerService",
    "WrongThreadError",
    "new_event_loop",
    "run_task",
]
