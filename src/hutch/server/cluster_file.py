"""The cluster file: DATA_DIR/cluster.json, what a node remembers about joining a cluster.

`hutchctl join_cluster` (RabbitMQ's `rabbitmqctl join_cluster`) writes the seed node's name and
peer address here while the application is stopped; the next start asks that seed to add this
node. `reset` deletes the file with the rest of the node's state.

This module only reads and writes the one file (atomically: a temporary file renamed over
it). It never decides anything about membership and imports nothing else from hutch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CLUSTER_FILE = "cluster.json"


def read_cluster_file(data_dir: str) -> dict:
    """The file's document, or {} when there is none (or it cannot be read)."""
    p = Path(data_dir) / CLUSTER_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def write_cluster_file(data_dir: str, doc: dict) -> None:
    p = Path(data_dir) / CLUSTER_FILE
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, p)
