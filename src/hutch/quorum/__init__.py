"""hutch.quorum: quorum queues — one Raft group per queue applying the queue's state machine.

`hutch.quorum.fifo` is the replicated state machine (commands in, effects out, snapshots);
the runtime that proposes commands and carries out the leader's effects lives above it.
"""
