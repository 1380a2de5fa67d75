"""Hooks a source connector gives the run around its checkpoints."""

from __future__ import annotations

import abc

__all__ = ["CompletionHook"]


class CompletionHook(abc.ABC):
    """Work after a checkpoint completed (``SourceConnector.completion_hook``).

    Threading: ``completed`` and ``close`` run on the coordinator's thread, in order."""

    @abc.abstractmethod
    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is committed in Postgres (it may block briefly)."""

    def close(self) -> None:
        """The run ends."""
        return None
