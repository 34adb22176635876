"""hutch as a Spark data source and sink (PySpark's Python Data Source API), format "hutch".

`HutchDataSource` picks the reader or writer the options ask for: a stream or super stream
(`stream`) read in batch or streaming over the stream protocol (`source`), a queue (`queue`)
read in streaming at least once over AMQP 0-9-1 (`queue`), rows written to a stream (`stream`)
or an exchange (`exchange`) with publisher confirms (`sink`). Options are checked when the
reader or writer is made (`options`), and the stream, queue or exchange is looked up before any
task runs, so that a bad option, an unknown name, a refused login or an unreachable node is an
error at query start. docs/spark.md is the user's guide.

The data source class is `datasource.HutchDataSource` (`hutch.spark.register` registers it);
`offsets` and `options` are pure and import no PySpark. This package is a client of hutch: it
talks to nodes over their protocols only.
"""
