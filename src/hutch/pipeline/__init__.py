"""hutch's data pipeline: histories of what clients did and saw, and the checker that judges them.

`history` (the format and its writer; pyarrow only, for the load tool), `check` (the
PySpark job behind `hutch check`), `reference` (the same definitions in plain Python),
`model` (the definitions shared by both), `synth` (histories with known defects),
`report` (the HTML page) and `spark` (the session). Like every client layer it talks to
nodes only through their public protocols and imports nothing of the broker.
"""
