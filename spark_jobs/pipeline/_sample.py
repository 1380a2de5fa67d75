"""What a pipeline's sample-data generator receives (``Pipeline(sample_data=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enumerator_service import Settings

__all__ = ["SampleTarget"]


@dataclass(frozen=True)
class SampleTarget:
    """Where ``sluice demo-data`` asks a pipeline's generator to write: the pipeline's
    landing folder (for a file source), the platform database (asyncpg DSN, for dimension
    tables), the settings (``SLUICE_DEMO_*`` sizes and seed) and a progress callback taking
    (what, done, total). The generator returns one line saying what it wrote."""

    settings: Settings
    landing: Path
    #: Holds the password: left out of ``repr``.
    dsn: str = field(repr=False)
    progress: Callable[[str, int, int], None] | None = None
