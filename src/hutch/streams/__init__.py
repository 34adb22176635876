"""Streams: replicated append-only logs of messages with offsets (`x-queue-type: stream`).

A stream is a Raft group (as a quorum queue is) whose committed entries are batches of
messages; every member applies them to its own on-disk log of chunks
(`hutch.store.stream_log`), numbering the messages with dense offsets. Consumers read the
log from any offset, on any member, without changing it; retention deletes whole segments
from the old end. See docs/streams.md.
"""
