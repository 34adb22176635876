"""The peer wire (sans-I/O) and the peer transport on loopback (docs/design/transport.md)."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from hutch.cluster import FrameTooLarge, HandshakeFailed, HandshakeRefused, PeerCodec, PeerProtocolError
from hutch.cluster.wire import (
    HANDSHAKE_FRAME_SIZE_MAX,
    SPLIT_PAYLOAD_MIN,
    Heartbeat,
    Message,
    PeerUp,
    PeerVerified,
)
from tests.cluster import SECRET, Node, linked_pair, run, wait_until

# -- the wire, without sockets --------------------------------------------------------------


def handshake(dialler_secret: str = SECRET, listener_secret: str = SECRET) -> tuple[PeerCodec, PeerCodec, list]:
    """Run a handshake between two codecs in memory, a byte at a time (framing must not care)."""
    d = PeerCodec("a@h", dialler_secret, "dialler", incarnation=7, expected_peer="b@h")
    li = PeerCodec("b@h", listener_secret, "listener", incarnation=9)
    events: list = []
    for byte in d.data_to_send():
        events += li.feed(bytes([byte]))
    for byte in li.data_to_send():
        events += d.feed(bytes([byte]))
    events += li.feed(d.data_to_send())
    return d, li, events


def test_handshake_proves_the_secret_both_ways_and_opens_both_ends():
    d, li, events = handshake()
    assert events == [PeerVerified("a@h", 7, 0, 0)]
    li.accept(1)
    assert d.feed(li.data_to_send()) == [PeerUp("b@h", 9, 1)]
    assert d.is_open and li.is_open and d.link == li.link == 1


def test_the_secret_itself_never_crosses_the_wire():
    d = PeerCodec("a@h", SECRET, "dialler", expected_peer="b@h")
    li = PeerCodec("b@h", SECRET, "listener")
    wire = d.data_to_send()
    li.feed(wire)
    wire2 = li.data_to_send()
    d.feed(wire2)
    wire3 = d.data_to_send()
    li.feed(wire3)
    li.accept(1)
    wire4 = li.data_to_send()
    for chunk in (wire, wire2, wire3, wire4):
        assert SECRET.encode() not in chunk


def test_wrong_secret_is_rejected_by_the_listener_naming_the_node_and_the_dialler_is_told():
    d = PeerCodec("a@h", "wrong", "dialler", expected_peer="b@h")
    li = PeerCodec("b@h", SECRET, "listener")
    li.feed(d.data_to_send())
    d.feed(li.data_to_send())
    with pytest.raises(HandshakeFailed, match="Connection attempt from node a@h rejected: invalid challenge reply"):
        li.feed(d.data_to_send())
    with pytest.raises(HandshakeRefused, match="invalid challenge reply"):
        d.feed(li.data_to_send())
    assert not d.is_open and not li.is_open


def test_a_recorded_challenge_reply_does_not_open_another_connection():
    # The listener's fresh nonce makes a proof good for one connection only.
    d = PeerCodec("a@h", SECRET, "dialler", expected_peer="b@h")
    li = PeerCodec("b@h", SECRET, "listener")
    hello = d.data_to_send()
    li.feed(hello)
    d.feed(li.data_to_send())
    reply = d.data_to_send()
    replay_target = PeerCodec("b@h", SECRET, "listener")
    replay_target.feed(hello)
    with pytest.raises(HandshakeFailed, match="invalid challenge reply"):
        replay_target.feed(reply)


def test_dialler_refuses_to_talk_to_a_node_other_than_the_one_it_dialled():
    d = PeerCodec("a@h", SECRET, "dialler", expected_peer="b@h")
    li = PeerCodec("c@h", SECRET, "listener")
    li.feed(d.data_to_send())
    with pytest.raises(HandshakeFailed, match="dialled node b@h but reached node c@h"):
        d.feed(li.data_to_send())


def test_messages_are_multiplexed_by_group_in_order():
    d, li, _ = handshake()
    li.accept(1)
    d.feed(li.data_to_send())
    wire = b"".join([d.encode("meta", {"term": 1}), d.encode(42, [1, 2]), d.encode_tick(),
                     d.encode("rpc", b"\x00\xff")])
    events = []
    for i in range(0, len(wire), 3):
        events += li.feed(wire[i:i + 3])
    assert events == [Message("meta", {"term": 1}), Message(42, [1, 2]), Heartbeat(), Message("rpc", b"\x00\xff")]


def test_frame_bytes_are_as_documented():
    # docs/design/transport.md, "Frames": u32 big-endian length, then a msgpack array.
    d, li, _ = handshake()
    li.accept(1)
    d.feed(li.data_to_send())
    assert d.encode("meta", 1) == bytes.fromhex("00000008 93 10 a46d657461 01")
    assert d.encode_tick() == bytes.fromhex("00000002 91 11")


@pytest.mark.parametrize("size", [SPLIT_PAYLOAD_MIN - 1, SPLIT_PAYLOAD_MIN, 65_535, 65_536, 1 << 20])
def test_a_large_payload_in_parts_is_the_same_frame_on_the_wire(size):
    d, li, _ = handshake()
    li.accept(1)
    d.feed(li.data_to_send())
    payload = bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)
    parts = d.encode_parts(7, payload)
    assert b"".join(parts) == d.encode(7, payload)
    assert (len(parts) == 2 and parts[1] is payload) == (size >= SPLIT_PAYLOAD_MIN)  # handed on, not copied
    assert li.feed(b"".join(parts)) == [Message(7, payload)]
    assert d.encode_parts("meta", [1, 2]) == (d.encode("meta", [1, 2]),)
    # a Raft message as the transport sends it, [group id, message]: the message is the tail part
    listed = [12345, payload]
    parts = d.encode_parts("raft", listed)
    assert b"".join(parts) == d.encode("raft", listed)
    assert (len(parts) == 2 and parts[1] is payload) == (size >= SPLIT_PAYLOAD_MIN)
    assert li.feed(b"".join(parts)) == [Message("raft", listed)]
    nested = [1, [payload]]  # bytes not at the list's own end: one part
    assert d.encode_parts("raft", nested) == (d.encode("raft", nested),)


def test_frames_over_the_limit_are_refused_on_both_sides():
    d = PeerCodec("a@h", SECRET, "dialler", expected_peer="b@h", frame_size_max=1000)
    li = PeerCodec("b@h", SECRET, "listener", frame_size_max=1000)
    li.feed(d.data_to_send())
    d.feed(li.data_to_send())
    li.feed(d.data_to_send())
    li.accept(1)
    d.feed(li.data_to_send())
    with pytest.raises(FrameTooLarge, match="exceeds frame_size_max 1000"):
        d.encode("meta", b"x" * 2000)
    big = PeerCodec("a@h", SECRET, "dialler", expected_peer="b@h", frame_size_max=SPLIT_PAYLOAD_MIN)
    big.state = "open"
    with pytest.raises(FrameTooLarge, match=f"exceeds frame_size_max {SPLIT_PAYLOAD_MIN}"):
        big.encode_parts("meta", b"x" * SPLIT_PAYLOAD_MIN)
    # The receiver refuses on the length prefix alone, before buffering the body.
    with pytest.raises(FrameTooLarge, match="frame of 5000 bytes"):
        li.feed(struct.pack(">I", 5000) + b"x" * 10)


def test_an_unauthenticated_peer_is_held_to_the_small_handshake_limit():
    li = PeerCodec("b@h", SECRET, "listener")
    with pytest.raises(FrameTooLarge, match=f"limit in state listener_await_hello is {HANDSHAKE_FRAME_SIZE_MAX}"):
        li.feed(struct.pack(">I", HANDSHAKE_FRAME_SIZE_MAX + 1))


def test_data_before_the_handshake_is_a_protocol_error():
    d = PeerCodec("a@h", SECRET, "dialler", expected_peer="b@h")
    with pytest.raises(PeerProtocolError, match="before the handshake"):
        d.encode("meta", 1)
    li = PeerCodec("b@h", SECRET, "listener")
    data = b"\x00\x00\x00\x03" + bytes([0x92, 0x10, 0xa1])  # truncated msgpack
    with pytest.raises(PeerProtocolError):
        li.feed(data)


# -- the transport on loopback ---------------------------------------------------------------


def test_two_nodes_connect_and_exchange_messages_in_order_per_group():
    async def go():
        a, b = await linked_pair()
        try:
            for i in range(500):
                assert a.transport.send("b@h", "meta", i)
                assert a.transport.send("b@h", 7, -i)
                assert b.transport.send("a@h", "rpc", {"n": i})
            await wait_until(lambda: len(b.messages) == 1000 and len(a.messages) == 500, what="all messages")
            assert b.received("a@h", "meta") == list(range(500))
            assert b.received("a@h", 7) == [-i for i in range(500)]
            assert a.received("b@h", "rpc") == [{"n": i} for i in range(500)]
            # One connection per pair, seen the same from both ends.
            assert a.transport.link_info("b@h") == {**b.transport.link_info("a@h"), "peer": "b@h",
                                                    "incarnation": b.transport.incarnation}
            assert a.downs == [] and b.downs == []
        finally:
            await a.close()
            await b.close()
    run(go())


def test_a_loop_iterations_frames_to_one_peer_leave_in_one_write():
    async def go():
        a, b = Node("a@h"), Node("b@h")
        await b.start()
        await a.start({"b@h": b.address})
        try:
            await wait_until(lambda: a.transport.is_up("b@h"), what="link up")
            writes_before = a.transport.writes
            for i in range(200):
                a.transport.send("b@h", "meta", i)
            await wait_until(lambda: len(b.messages) == 200, what="200 messages")
            # 200 frames in one iteration: one write (a heartbeat may add one).
            assert a.transport.writes - writes_before <= 2
        finally:
            await a.close()
            await b.close()
    run(go())


def test_three_nodes_dialling_each_other_at_once_keep_one_link_per_pair():
    async def go():
        nodes = [Node(f"n{i}@h") for i in range(3)]
        book = {n.name: n.address for n in nodes}
        await asyncio.gather(*(n.start({k: v for k, v in book.items() if k != n.name}) for n in nodes))
        try:
            await wait_until(lambda: all(len(n.transport.up_peers) == 2 for n in nodes), what="full mesh")
            for n in nodes:
                for m in nodes:
                    if m is not n:
                        for i in range(100):
                            assert n.transport.send(m.name, "meta", (n.name, i))
            await wait_until(lambda: all(len(n.messages) == 200 for n in nodes), what="all messages")
            for n in nodes:
                for m in nodes:
                    if m is not n:
                        assert n.received(m.name, "meta") == [[m.name, i] for i in range(100)]
                        mine, theirs = n.transport.link_info(m.name), m.transport.link_info(n.name)
                        assert mine["dialled_by"] == theirs["dialled_by"] and mine["link"] == theirs["link"]
            # The simultaneous connects were settled during the handshake: no link flapped.
            assert all(n.downs == [] for n in nodes)
            assert all(sorted(n.ups) == sorted(m.name for m in nodes if m is not n) for n in nodes)
        finally:
            await asyncio.gather(*(n.close() for n in nodes))
    run(go())


def test_wrong_secret_is_refused_both_ways_and_the_peer_never_comes_up(caplog):
    caplog.set_level(logging.WARNING, logger="hutch.cluster.transport")

    async def go():
        a, b = Node("a@h"), Node("b@h", secret="another-secret")
        await a.start({"b@h": b.address})
        await b.start({"a@h": a.address})
        try:
            def rejected(node: str) -> bool:
                return any(f"Connection attempt from node {node} rejected: invalid challenge reply" in r.getMessage()
                           for r in caplog.records)
            await wait_until(lambda: rejected("a@h") and rejected("b@h"), what="both rejections logged")
            await wait_until(lambda: any("Connection to node b@h refused: invalid challenge reply"
                                         in r.getMessage() for r in caplog.records), what="dialler told")
            assert a.ups == [] and b.ups == []
            assert not a.transport.is_up("b@h") and not b.transport.is_up("a@h")
            assert a.transport.send("b@h", "meta", 1) is False
        finally:
            await a.close()
            await b.close()
    run(go())


def test_a_stopped_peer_is_reported_down_and_up_again_after_restart(caplog):
    caplog.set_level(logging.INFO, logger="hutch.cluster.transport")

    async def go():
        a, b = Node("a@h"), Node("b@h")
        await b.start()
        await a.start({"b@h": b.address})
        try:
            await wait_until(lambda: a.transport.is_up("b@h"), what="link up")
            await b.close()
            await wait_until(lambda: a.downs, what="a sees b down")
            assert a.downs[0][:2] == ("b@h", "connection_closed")
            assert any("node b@h down: connection_closed" in r.getMessage() for r in caplog.records)
            b2 = Node("b@h", port=b.port)
            await b2.start()
            try:
                await wait_until(lambda: a.transport.is_up("b@h") and b2.transport.is_up("a@h"), what="back up")
                assert a.ups == ["b@h", "b@h"]
                assert a.transport.send("b@h", "meta", "again")
                await wait_until(lambda: b2.received("a@h", "meta") == ["again"], what="message after restart")
            finally:
                await b2.close()
        finally:
            await a.close()
    run(go())


def test_an_isolated_node_neither_dials_its_peers_again_nor_accepts_them():
    """A node whose storage failed isolates itself as it stops: its peers must see it gone, not
    linked again a moment later. Found by `make campaign-long` (run 37): the node's dial loops
    went on after `isolate`, linked to both peers again within 20 ms while it stopped, and its
    mirrored queue's leader let mirrors join its ring meanwhile."""
    async def go():
        a, b = await linked_pair()
        try:
            a.transport.isolate()
            await wait_until(lambda: b.downs, what="b sees a down")
            await asyncio.sleep(1.0)  # several dial backoffs of both ends
            assert not a.transport.is_up("b@h") and not b.transport.is_up("a@h")
            assert a.ups == ["b@h"] and b.ups == ["a@h"]
        finally:
            await a.close()
            await b.close()
    run(go())


def test_a_message_bigger_than_the_frame_limit_is_refused_at_send():
    async def go():
        a, b = Node("a@h", frame_size_max=4096), Node("b@h", frame_size_max=4096)
        await b.start()
        await a.start({"b@h": b.address})
        try:
            await wait_until(lambda: a.transport.is_up("b@h"), what="link up")
            with pytest.raises(FrameTooLarge):
                a.transport.send("b@h", "meta", b"x" * 10_000)
            assert a.transport.send("b@h", "meta", b"x" * 1000)
            await wait_until(lambda: len(b.messages) == 1, what="small message")
        finally:
            await a.close()
            await b.close()
    run(go())


def test_a_peer_sending_an_oversized_frame_is_disconnected():
    async def go():
        a, b = Node("a@h", frame_size_max=1 << 20), Node("b@h", frame_size_max=4096)
        await b.start()
        await a.start({"b@h": b.address})
        try:
            await wait_until(lambda: a.transport.is_up("b@h"), what="link up")
            assert a.transport.send("b@h", "meta", b"x" * 10_000)
            await wait_until(lambda: b.downs, what="b drops a")
            assert b.downs[0][0] == "a@h" and "frame of" in b.downs[0][1]
            assert b.messages == []
        finally:
            await a.close()
            await b.close()
    run(go())
