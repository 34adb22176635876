"""Exchanges and routing (hutch.broker.exchanges), as AMQP 0-9-1 and RabbitMQ 3.10 route.

Topic: a routing key and a binding key are dot-separated words; `*` stands for exactly one
word, `#` for zero or more; an empty key has no words, and `a..b` has an empty middle word.
The matcher is held against a plainly recursive reference under hypothesis. Headers:
`x-match` all (default) or any over the binding's arguments, keys starting with `x-` ignored
unless the mode is all-with-x / any-with-x, a void binding value matching on presence alone,
and values compared by type class as RabbitMQ does.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.broker.exchanges import EXCHANGE, QUEUE, Binding, Exchange, headers_match, topic_matches


def words(key: str) -> list[str]:
    return key.split(".") if key else []


def matches(pattern: str, key: str) -> bool:
    return topic_matches(words(pattern), words(key))


@functools.cache
def reference_match(pattern: tuple[str, ...], key: tuple[str, ...]) -> bool:
    """Topic matching by its definition, one word at a time."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":  # zero words, or one more word and still '#'
        return reference_match(rest, key) or (bool(key) and reference_match(pattern, key[1:]))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference_match(rest, key[1:])


# ------------------------------------------------------------------ topic: the edge cases

@pytest.mark.parametrize("pattern,key,expected", [
    ("#", "", True),  # '#' matches zero words
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("#.#", "", True),
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.z.b", True),
    ("a.#.b", "a.b.b", True),
    ("a.#.b", "a", False),
    ("a.#.b", "a.b.c", False),
    ("a.#.b", "b", False),
    ("*", "a", True),
    ("*", "", False),  # '*' is exactly one word; the empty key has none
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("*.*", ".", True),  # two empty words
    ("*.*", "a.", True),
    ("*.*", "a", False),
    ("*.*", "", False),
    ("*.*", "a.b.c", False),
    ("", "", True),  # empty binding key matches only the empty routing key
    ("", "a", False),
    ("a", "", False),
    ("a..b", "a..b", True),  # empty words are words
    ("a.*.b", "a..b", True),
    ("a..b", "a.b", False),
    ("a.b", "a..b", False),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("#.*", "a.b.c", True),
    ("#.*.#", "a", True),
    ("#.*.#", "", False),
    ("#.a.#.b.#", "a.b", True),
    ("#.a.#.b.#", "x.a.y.b.z", True),
    ("#.a.#.b.#", "b.a", False),
    ("#.#.#", "", True),
    ("a.#.#.b", "a.b", True),
    ("a.*.#.*.b", "a.x.b", False),
    ("a.*.#.*.b", "a.x.y.b", True),
    ("stock.#", "stock.usd.nyse", True),
    ("*.orange.*", "quick.orange.rabbit", True),
    ("*.*.rabbit", "quick.orange.fox", False),
    ("lazy.#", "lazy.orange.male.rabbit", True),
])
def test_topic_matches_edge_cases(pattern, key, expected):
    assert matches(pattern, key) is expected
    assert reference_match(tuple(words(pattern)), tuple(words(key))) is expected


pattern_words = st.sampled_from(["a", "b", "", "*", "#"])
key_words = st.sampled_from(["a", "b", ""])


@settings(max_examples=500, deadline=None)
@given(pattern=st.lists(pattern_words, max_size=7).map(".".join), key=st.lists(key_words, max_size=8).map(".".join))
def test_topic_matches_agrees_with_the_recursive_reference(pattern, key):
    assert matches(pattern, key) == reference_match(tuple(words(pattern)), tuple(words(key)))


@settings(max_examples=300, deadline=None)
@given(key=st.lists(st.sampled_from(["a", "b", "c", ""]), max_size=6).map(".".join))
def test_a_key_always_matches_itself_hash_and_its_stars(key):
    assert matches(key, key)
    assert matches("#", key)
    assert matches(".".join("*" for _ in words(key)), key)


# ------------------------------------------------------------------ headers

@pytest.mark.parametrize("args,headers,expected", [
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),  # all is the default
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1}, {"a": 2}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1}, {}, False),
    ({"x-match": "all"}, {}, True),  # nothing to check: all of nothing holds
    ({"x-match": "any"}, {"a": 1}, False),  # ... and any of nothing does not
    ({"x-match": b"any", "a": 1}, {"a": 1}, True),  # x-match may arrive as bytes
    # x- keys are ignored by all and any ...
    ({"x-match": "all", "x-trace": "on", "a": 1}, {"a": 1}, True),
    ({"x-match": "any", "x-trace": "on"}, {"x-trace": "on"}, False),
    ({"x-match": "all", "x-trace": "on"}, {}, True),
    # ... and taken into account by all-with-x and any-with-x
    ({"x-match": "all-with-x", "x-trace": "on", "a": 1}, {"a": 1}, False),
    ({"x-match": "all-with-x", "x-trace": "on", "a": 1}, {"a": 1, "x-trace": "on"}, True),
    ({"x-match": "any-with-x", "x-trace": "on", "a": 1}, {"x-trace": "on"}, True),
    ({"x-match": "any-with-x", "x-trace": "on"}, {"x-trace": "off"}, False),
    # a void binding value matches on the key's presence, whatever the value
    ({"a": None}, {"a": "anything"}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {"b": 1}, False),
    ({"x-match": "any", "a": None, "b": 2}, {"a": 0}, True),
    # a void header value is only equal to a void binding value
    ({"a": 1}, {"a": None}, False),
    # type classes as RabbitMQ compares them
    ({"a": 1}, {"a": True}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": 1}, {"a": 1.0}, False),
    ({"a": 1.5}, {"a": 1.5}, True),
    ({"a": 300}, {"a": 300}, True),
    ({"a": "1"}, {"a": 1}, False),
    ({"a": {"n": [1, "x"]}}, {"a": {"n": [1, "x"]}}, True),
])
def test_headers_match(args, headers, expected):
    assert headers_match(args, headers) is expected


header_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "y"]))
header_tables = st.dictionaries(st.sampled_from(["a", "b", "c", "x-k"]), header_values, max_size=4)


def reference_headers_match(args: dict, headers: dict) -> bool:
    mode = args.get("x-match", "all")
    with_x = mode.endswith("-with-x")
    keys = [k for k in args if k != "x-match" and (with_x or not k.startswith("x-"))]

    def one(k):
        if k not in headers:
            return False
        if args[k] is None:
            return True
        return type(args[k]) is type(headers[k]) and args[k] == headers[k]

    return any(map(one, keys)) if mode.startswith("any") else all(map(one, keys))


@settings(max_examples=250, deadline=None)
@given(args=header_tables, mode=st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"]),
       headers=header_tables)
def test_headers_match_agrees_with_a_reference(args, mode, headers):
    if mode is not None:
        args = {**args, "x-match": mode}
    assert headers_match(args, headers) == reference_headers_match(args, headers)


# ------------------------------------------------------------------ exchanges route

def bind(x: Exchange, dest: str, key: str = "", args: dict | None = None, kind: str = QUEUE) -> Binding:
    b = Binding(x.name, dest, kind, key, args)
    x.add_binding(b)
    return b


def routed(x: Exchange, key: str, headers: dict | None = None) -> list[tuple[str, str]]:
    return sorted(b.target for b in x.route(key, headers))


def test_direct_exchange_routes_on_equal_keys_only():
    x = Exchange("d", "direct")
    bind(x, "q1", "k")
    bind(x, "q2", "k")
    bind(x, "q3", "other")
    bind(x, "q4", "")
    assert routed(x, "k") == [(QUEUE, "q1"), (QUEUE, "q2")]
    assert routed(x, "") == [(QUEUE, "q4")]
    assert routed(x, "K") == []


def test_fanout_exchange_routes_to_every_binding():
    x = Exchange("f", "fanout")
    bind(x, "q1", "ignored")
    bind(x, "e2", "", kind=EXCHANGE)
    assert routed(x, "anything") == [(EXCHANGE, "e2"), (QUEUE, "q1")]


def test_topic_exchange_routes_by_pattern():
    x = Exchange("t", "topic")
    bind(x, "all", "#")
    bind(x, "usd", "stock.usd.*")
    bind(x, "empty", "")
    bind(x, "stars", "*.*")
    assert routed(x, "stock.usd.nyse") == [(QUEUE, "all"), (QUEUE, "usd")]
    assert routed(x, "") == [(QUEUE, "all"), (QUEUE, "empty")]
    assert routed(x, "a.b") == [(QUEUE, "all"), (QUEUE, "stars")]


def test_headers_exchange_routes_by_arguments_not_key():
    x = Exchange("h", "headers")
    bind(x, "pdf", "ignored", {"x-match": "all", "format": "pdf", "type": "report"})
    bind(x, "any", "", {"x-match": "any", "format": "zip", "type": "log"})
    assert routed(x, "k", {"format": "pdf", "type": "report"}) == [(QUEUE, "pdf")]
    assert routed(x, "k", {"type": "log"}) == [(QUEUE, "any")]
    assert routed(x, "k", None) == []


def test_bindings_are_unique_by_destination_key_and_arguments():
    x = Exchange("d", "direct")
    b = bind(x, "q", "k", {"x": [1, {"y": 2}]})
    assert not x.add_binding(Binding("d", "q", QUEUE, "k", {"x": [1, {"y": 2}]}))
    assert x.add_binding(Binding("d", "q", QUEUE, "k", {"x": [1, {"y": 3}]}))
    assert x.add_binding(Binding("d", "q", EXCHANGE, "k", {"x": [1, {"y": 2}]}))
    assert x.remove_binding(b.key) is b
    assert x.remove_binding(b.key) is None
    assert routed(x, "k") == [(EXCHANGE, "q"), (QUEUE, "q")]


def test_alternate_exchange_argument_is_read_as_text():
    assert Exchange("x", "direct", arguments={"alternate-exchange": b"ae"}).alternate == "ae"
    assert Exchange("x", "direct", arguments={"alternate-exchange": "ae"}).alternate == "ae"
    assert Exchange("x", "direct").alternate is None
