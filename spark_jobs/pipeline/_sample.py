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
    (what, done, total). The generator returns one line saying what it wrote.

    Contract (sample data never lands in real data): the command has checked that
    ``landing`` is missing, empty or holds only earlier sample files, and lists what is there
    afterwards; the generator creates every table through ``claim_demo_table`` — all of them
    before it writes anything, in the transaction that writes them — so a table it did not
    create raises ``DemoDataRefused`` and nothing changes."""

    settings: Settings
    landing: Path
    #: Holds the password: left out of ``repr``.
    dsn: str = field(repr=False)
    progress: Callable[[str, int, int], None] | None = None
