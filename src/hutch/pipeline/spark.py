"""Starting a SparkSession the way hutch's checker wants one: quiet, loopback, lean.

PySpark launches a JVM from the installed package. Before it does, this module points it
at 127.0.0.1 (a lab machine's other interfaces are none of Spark's business), at this
virtualenv's Python for the workers, and at the log4j2 configuration shipped next to this
file (warnings only); the web UI and the console progress bar are off. `quick_jvm` trades
peak speed for start-up CPU (C1 compiler only, serial GC): right for tests and small
histories, wrong for a hundred million events. Any Spark master works: ``local[*]``, a
standalone ``spark://host:port``, or anything else `SparkSession.builder.master` takes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SPARK_CONF_DIR = Path(__file__).with_name("spark_conf")
QUICK_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
DEFAULT_SHUFFLE_PARTITIONS = 8


def prepare_environment() -> None:
    """Environment a Spark driver and its Python workers read at launch."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(SPARK_CONF_DIR))
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")


def session(
    master: str = "local[*]",
    app_name: str = "hutch-check",
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    driver_memory: str = "2g",
    quick_jvm: bool = False,
    extra_conf: dict[str, str] | None = None,
):
    """A SparkSession for the checker (or the one already running in this process)."""
    prepare_environment()
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile={SPARK_CONF_DIR / 'log4j2.properties'}"
    if quick_jvm:
        java_opts += " " + QUICK_JVM_FLAGS
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
    conf.update(extra_conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
