"""The connector's options, checked before anything connects: a bad value is an error when the
query is defined or starts, never a hang.

Spark hands options over with their names lowercased; `Options` reads them in any case. Where to
connect comes from `uri`: one or more URIs separated by commas (nodes of one cluster, tried in
turn), each rabbitmq-stream://, hutch-stream:// or amqp:// (for amqp:// the stream protocol is
asked on port 5552 of the same host unless the URI adds `?stream_port=N`; the queue source and
the exchange sink use the amqp:// URI as it is).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from hutch.streamclient import StreamEndpoint

SOURCE_OPTIONS = ("uri", "stream", "queue", "startingoffsets", "endingoffsets", "maxmessagespertrigger",
                  "consumername", "minpartitions")
SINK_OPTIONS = ("uri", "stream", "exchange", "producername", "routingkey")
MAX_MESSAGES_PER_TRIGGER_MAX = 10_000_000
QUEUE_MESSAGES_PER_TRIGGER_DEFAULT = 10_000  # what the queue source takes per micro-batch unless told
PARTITIONS_MAX = 1024


class ConnectorError(ValueError):
    """A bad option, an unknown stream or queue, a refused login, an unreachable node: what the
    user must fix, said in one line."""


@dataclass(frozen=True)
class Start:
    """Where a partition's reading starts: `kind` earliest, latest, timestamp (value in ms) or
    offset (value the offset)."""

    kind: str
    value: int = 0


def _lower(options) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def parse_timestamp(text: str) -> int | None:
    """An ISO-8601 date-time (UTC unless it says otherwise) as ms since the epoch, else None."""
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def parse_offsets(option: str, text: str, allowed: tuple[str, ...]) -> Start | dict[str, Start]:
    """`earliest` / `latest` (those of them `allowed`), an ISO-8601 timestamp, or JSON mapping
    partition streams to an offset or one of the allowed words."""
    text = text.strip()
    if text in allowed:
        return Start(text)
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise ConnectorError(f"option {option}: not valid JSON ({e})") from None
        out: dict[str, Start] = {}
        for k, v in raw.items() if isinstance(raw, dict) else ():
            if v in allowed:
                out[str(k)] = Start(v)
            elif isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                out[str(k)] = Start("offset", v)
            else:
                raise ConnectorError(f"option {option}: {k!r}: {v!r} is not an offset (a number not below 0)"
                                     f" or one of {', '.join(allowed)}")
        if not isinstance(raw, dict) or not out:
            raise ConnectorError(f"option {option}: JSON must map partition streams to offsets")
        return out
    ts = parse_timestamp(text) if "timestamp" in allowed else None
    if ts is not None:
        return Start("timestamp", ts)
    words = " | ".join(a for a in allowed if a != "timestamp")
    raise ConnectorError(f"option {option}: {text!r} is not {words}" +
                         (" | an ISO-8601 timestamp" if "timestamp" in allowed else "") + " | JSON per partition")


def _positive(options: dict[str, str], name: str, key: str, bound: int) -> int | None:
    text = options.get(key)
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        raise ConnectorError(f"option {name}: {text!r} is not a whole number") from None
    if not 1 <= n <= bound:
        raise ConnectorError(f"option {name}: {n} is not within 1..{bound}")
    return n


@dataclass(frozen=True)
class Options:
    uris: tuple[str, ...]
    stream: str | None = None
    queue: str | None = None
    exchange: str | None = None
    starting: Start | dict[str, Start] | None = None
    ending: Start | dict[str, Start] = Start("latest")
    max_per_trigger: int | None = None
    consumer_name: str = ""
    min_partitions: int = 1
    producer_name: str = ""
    routing_key: str = ""

    @property
    def endpoints(self) -> list[StreamEndpoint]:
        return [StreamEndpoint.from_uri(u, amqp=True) for u in self.uris]

    @property
    def amqp_uris(self) -> list[str]:
        """The URIs for AMQP 0-9-1 (the queue source, the exchange sink): amqp:// ones only."""
        return [u for u in self.uris if urlsplit(u).scheme in ("amqp", "amqps")]


def _uris(options: dict[str, str], amqp_needed: bool) -> tuple[str, ...]:
    text = options.get("uri", "").strip()
    if not text:
        raise ConnectorError("option uri is required (hutch-stream://user:pass@host:5552, rabbitmq-stream://..."
                             " or amqp://...)")
    uris = tuple(u.strip() for u in text.split(",") if u.strip())
    for u in uris:
        try:
            ep = StreamEndpoint.from_uri(u, amqp=True)
        except ValueError as e:
            raise ConnectorError(f"option uri: {e}") from None
        if not ep.host:
            raise ConnectorError(f"option uri: {u!r} names no host")
    if amqp_needed and not any(urlsplit(u).scheme == "amqp" for u in uris):
        raise ConnectorError("option uri: a queue or an exchange is reached over AMQP 0-9-1: give an amqp:// URI")
    return uris


def source_options(options) -> Options:
    o = _lower(options)
    stream, queue = o.get("stream"), o.get("queue")
    if (stream is None) == (queue is None):
        raise ConnectorError("give exactly one of the options stream (a stream or a super stream) and queue")
    uris = _uris(o, amqp_needed=queue is not None)
    starting = None  # the reader's default: earliest for a batch read, latest for a streaming one (as Kafka's)
    if "startingoffsets" in o:
        starting = parse_offsets("startingOffsets", o["startingoffsets"], ("earliest", "latest", "timestamp"))
    ending = parse_offsets("endingOffsets", o.get("endingoffsets", "latest"), ("latest",))
    if isinstance(ending, Start) and ending.kind != "latest":
        raise ConnectorError("option endingOffsets: latest or JSON per partition")
    return Options(
        uris=uris, stream=stream, queue=queue, starting=starting, ending=ending,
        max_per_trigger=_positive(o, "maxMessagesPerTrigger", "maxmessagespertrigger", MAX_MESSAGES_PER_TRIGGER_MAX),
        consumer_name=o.get("consumername") or f"spark-{stream or queue}",
        min_partitions=_positive(o, "minPartitions", "minpartitions", PARTITIONS_MAX) or 1)


def sink_options(options) -> Options:
    o = _lower(options)
    stream, exchange = o.get("stream"), o.get("exchange")
    if (stream is None) == (exchange is None):
        raise ConnectorError("give exactly one of the options stream and exchange (\"\" is the default exchange)")
    uris = _uris(o, amqp_needed=exchange is not None)
    producer = o.get("producername", "")
    if not producer and o.get("checkpointlocation"):
        # one name per query: its checkpoint is what makes a replayed micro-batch the same batch
        producer = "spark-" + hashlib.sha1(o["checkpointlocation"].encode()).hexdigest()[:16]
    if len(producer) > 200:
        raise ConnectorError("option producerName: at most 200 characters")
    return Options(uris=uris, stream=stream, exchange=exchange, producer_name=producer,
                   routing_key=o.get("routingkey", ""))
