"""Checks a page runs at its ``<!-- docs-test: check: <name> -->`` lines (``test_doc_blocks``):
what a reader does by clicking, driven by the test, and assertions on what came out."""

from __future__ import annotations

from collections.abc import Callable

from docs_runner import PageRun

CHECKS: dict[str, Callable[[PageRun], None]] = {}
