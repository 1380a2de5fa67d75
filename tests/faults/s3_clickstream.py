"""The clickstream example with its landing on an object store (the module named in
``SLUICE_PIPELINES`` by the S3 cluster and S3 fault tests; importable as
``tests.faults.s3_clickstream`` with the repository on ``PYTHONPATH``).

``clickstream_s3`` is ``examples.clickstream`` with ``FileSource(landing=<URI>)``, the URI
read from ``SLUICE_TEST_S3_LANDING`` when the module is imported (the test's bucket changes
from run to run); its warehouse is the run's ``SLUICE_WAREHOUSE_DIR`` (``s3://…`` too in
those tests). Only this one pipeline is registered: the example's module is imported as a
module, its ``Pipeline`` is not a top-level name here.
"""

from __future__ import annotations

import dataclasses
import os

import examples.clickstream as _example
from spark_jobs import Pipeline

__all__ = ["LANDING_SETTING", "clickstream_s3"]

LANDING_SETTING = "SLUICE_TEST_S3_LANDING"

clickstream_s3: Pipeline = dataclasses.replace(
    _example.clickstream,
    name="clickstream_s3",
    description="The clickstream example reading its events from an object store.",
    source=dataclasses.replace(
        _example.clickstream.source,
        landing=os.environ.get(LANDING_SETTING, "s3://sluice-landing-unset/events"),
    ),
)
