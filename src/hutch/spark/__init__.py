"""hutch for Spark: `hutch.spark.register(spark)` makes format "hutch" available to a session.

    import hutch.spark
    hutch.spark.register(spark)
    df = (spark.readStream.format("hutch")
          .option("uri", "hutch-stream://guest:guest@localhost:5552")
          .option("stream", "events")
          .option("startingOffsets", "earliest")
          .load())

The source and sink live in `hutch.pipeline.connector`; docs/spark.md tells how to use them.
"""

from __future__ import annotations

from hutch.pipeline.connector.datasource import FORMAT, ConnectorError, HutchDataSource


def register(spark) -> None:
    """Register the data source "hutch" with a SparkSession (once per session is enough)."""
    spark.dataSource.register(HutchDataSource)


__all__ = ["register", "HutchDataSource", "ConnectorError", "FORMAT"]
