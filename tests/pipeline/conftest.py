"""Fixtures of the pipeline tests: one SparkSession for every Spark test, and synthetic histories.

Starting Spark costs seconds, so all tests marked `spark` share the session this file
starts once (local[2], two shuffle partitions, a JVM tuned for start-up) and stops at the
end. Tests without the mark never import PySpark.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from hutch.pipeline.spark import session

    s = session(master="local[2]", app_name="hutch-pipeline-tests", shuffle_partitions=2,
                driver_memory="1g", quick_jvm=True)
    yield s
    s.stop()
