"""Spark's Python workers of this test process's local JVM, for tests that kill one.

Workers are forked by the Python daemon (``-m spark_jobs._daemon``, see
``spark_jobs._daemon``), which is the JVM's child; a worker is a child of a daemon with the
daemon's command line. The daemon itself is never returned: its command line names the worker
module too, so matching names alone would find (and kill) it.
"""

from __future__ import annotations

import os

import psutil

__all__ = ["python_workers"]


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def python_workers() -> list[psutil.Process]:
    """The live Python workers forked by this process's Spark daemons."""
    procs = psutil.Process(os.getpid()).children(recursive=True)
    daemons = {p.pid for p in procs if "-m spark_jobs._daemon" in _cmdline(p)}
    workers = []
    for p in procs:
        try:
            if p.pid in daemons and p.ppid() in daemons and p.status() != "zombie":
                workers.append(p)
        except psutil.Error:
            continue
    return workers
