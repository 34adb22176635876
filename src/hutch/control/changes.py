"""Management API changes on a clustered node: catalogue commands, answered once committed.

In a cluster a node's vhosts, users, permissions, exchanges, bindings, queues and policies are
a view of the replicated catalogue (`hutch.cluster.catalogue`, see docs/design/catalogue.md).
The API therefore never changes those objects itself there: a handler checks the request
exactly as on a single node (the same 400 reasons, the same permission checks), builds the
catalogue command, and `commit` proposes it through `broker.cluster.submit` and waits until
this node has applied the committed command. By then `ClusterBroker.apply_command` has
brought the node's own objects in line, so whatever the client reads next from this node
already shows the change, and every other node applies the same command.

A command the catalogue refuses maps to the HTTP answer RabbitMQ's API gives for the same
AMQP error (`errors.from_amqp`: 404 not_found, 403 as 401 not_authorised, 405/406 and the
rest as 400 bad_request with "PRECONDITION_FAILED - ..." as the reason). A change that cannot
commit — no majority reachable within the node's metadata timeout (541), or the node is
shutting down (320) — is a 503 and has changed nothing this node knows of.

What it must never do: change a broker object directly, or answer before the commit.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from aiohttp import web

from hutch.amqp import spec
from hutch.amqp.spec import AMQPError
from hutch.cluster import catalogue as cat
from hutch.control.errors import ApiError, from_amqp

if TYPE_CHECKING:
    from hutch.broker.broker import Broker

# The runtime always answers a proposal (with a 541 after metadata_timeout_ms); this is only a
# backstop so that a lost answer cannot hold an HTTP request for ever.
ANSWER_GRACE_S = 5.0


async def change(broker: Broker, cmd: cat.Command) -> cat.Result:
    """Propose `cmd` to the cluster's catalogue; its Result once this node has applied it
    (or the 541 error the runtime gives when no majority is reachable)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[cat.Result] = loop.create_future()

    def applied(res: cat.Result) -> None:
        if not fut.done():  # the request may have been cancelled meanwhile
            fut.set_result(res)

    broker.cluster.submit(cmd, applied)
    wait_s = broker.config.metadata_timeout_ms / 1000 + ANSWER_GRACE_S
    try:
        return await asyncio.wait_for(fut, wait_s)
    except TimeoutError:
        return cat.Result(cat.ERROR, spec.INTERNAL_ERROR,
                          f"timed out after {wait_s:.0f} s waiting for the cluster metadata store")


CATCH_UP_WAIT_S = 2.0  # how long a read waits for `caught_up` before it answers from what it has


async def caught_up(broker: Broker) -> bool:
    """Whether this node has applied everything the cluster's catalogue committed before the
    call (a catalogue barrier, waited for CATCH_UP_WAIT_S at most; False at once on a node that
    reaches no majority): a read that misses an
    object asks for it before it answers 404, so that what a client made through another node
    a moment ago is found here too, as RabbitMQ's synchronously replicated metadata is."""
    if broker.cluster is None:
        return True
    if not broker.cluster.reaches_majority():
        return False  # no barrier can commit: answer from what this node has, at once
    try:
        res = await asyncio.wait_for(change(broker, cat.Barrier()), CATCH_UP_WAIT_S)
    except TimeoutError:
        return False
    return res.ok


def http_error(res: cat.Result) -> ApiError:
    """The API's error answer for a refused or failed catalogue command."""
    if res.code == spec.INTERNAL_ERROR:
        return ApiError(503, "timeout", res.text)
    if res.code == spec.CONNECTION_FORCED:
        return ApiError(503, "unavailable", res.text)
    return from_amqp(AMQPError(res.code, res.text))


async def commit(broker: Broker, cmd: cat.Command) -> cat.Result:
    """`change`, raising the API's error answer unless the command succeeded."""
    res = await change(broker, cmd)
    if res.code != cat.OK:
        raise http_error(res)
    return res


async def commit_all(broker: Broker, cmds: list[cat.Command]) -> list[cat.Result]:
    """Commit commands one after another (each may depend on the ones before); the first that
    fails stops the rest and is raised."""
    return [await commit(broker, cmd) for cmd in cmds]


def put_answer(res: cat.Result) -> web.Response:
    """A PUT's answer: 201 when it created the object, 204 when one was there already."""
    return web.Response(status=201 if res.status == cat.CREATED else 204)


def delete_answer(res: cat.Result) -> web.Response:
    """A DELETE's answer: 204, or 404 when the object was gone by the time the delete committed."""
    if res.status == cat.ABSENT:
        raise ApiError(404, "Object Not Found", "Not Found")
    return web.Response(status=204)


def new_journal_id() -> int:
    """A durable queue's journal id: random 63 bits, chosen by the proposer (never zero)."""
    return int.from_bytes(os.urandom(8), "big") >> 1 or 1
