"""DeltaColumn (integers kept as differences in the narrowest width) and KeyedColumns (entries
under ascending keys), against a plain list and a dict."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.queues.columns import BLOCK, DeltaColumn, KeyedColumns

MASK = (1 << 64) - 1

_value = st.one_of(st.integers(0, 3), st.integers(0, 300), st.integers(0, 70_000), st.integers(0, MASK),
                   st.sampled_from([1 << 63, (1 << 63) - 1, MASK, 1 << 32]))
_op = st.one_of(
    st.tuples(st.just("append"), _value),
    st.tuples(st.just("step"), st.integers(-2, 40)),  # the next value near the last: a typical run
    st.tuples(st.just("take"), st.integers(0, 3 * BLOCK)),
    st.tuples(st.just("read"), st.integers(0, 10 * BLOCK)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.just("step"), st.integers(0, 3)), max_size=BLOCK * 3) | st.lists(_op, max_size=400),
       st.integers(1, 40))
def test_a_column_returns_what_was_appended_in_order(ops, repeat):
    col, model = DeltaColumn(), []
    last = 1000
    for op, arg in ops:
        for _ in range(repeat if op == "step" else 1):
            if op == "append":
                last = arg
                col.append(arg)
                model.append(arg)
            elif op == "step":
                last = (last + arg) & MASK
                col.append(last)
                model.append(last)
            elif op == "take":
                assert col.take(arg) == model[:arg]
                del model[:arg]
            elif op == "read" and model:
                i = arg % len(model)
                assert col[i] == model[i]
                assert col.values(arg, i) == model[i:i + arg]
        assert len(col) == len(model)
    assert col.tolist() == model
    if model:
        assert col.last == model[-1]


@given(st.lists(st.integers(1, 5), min_size=1, max_size=3 * BLOCK), st.integers(0, 2 * BLOCK), st.data())
def test_index_finds_a_value_in_a_column_that_never_decreases(steps, taken, data):
    col, model, v = DeltaColumn(), [], 7
    for s in steps:
        v += s
        col.append(v)
        model.append(v)
    col.take(taken)
    del model[:taken]
    probe = data.draw(st.integers(0, v + 2))
    assert col.index(probe) == (model.index(probe) if probe in model else -1)


def test_a_run_of_close_values_costs_about_a_byte_each_and_a_far_value_widens_the_column():
    col = DeltaColumn()
    for i in range(100_000):
        col.append(5_000_000 + 2 * i)
    assert col.memory_bytes() < 100_000 * 1.2
    col.append(1 << 63)  # a scratch-log location among journal seqs
    col.append(5)
    assert col.tolist()[-3:] == [5_000_000 + 2 * 99_999, 1 << 63, 5]
    assert col.memory_bytes() > 100_000 * 8
    col.clear()  # emptied, it starts narrow again
    for i in range(1000):
        col.append(7 + i)
    assert col.tolist() == [7 + i for i in range(1000)] and col.memory_bytes() < 1000 * 1.2


def test_taking_from_the_front_frees_the_front_and_keeps_the_rest():
    col = DeltaColumn()
    for i in range(10 * BLOCK):
        col.append(i * 3)
    assert col.take(7 * BLOCK + 5) == [i * 3 for i in range(7 * BLOCK + 5)]
    assert col.memory_bytes() < 10 * BLOCK  # the hole went, in whole blocks
    assert col.tolist() == [i * 3 for i in range(7 * BLOCK + 5, 10 * BLOCK)]
    assert col[0] == (7 * BLOCK + 5) * 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 3), st.integers(0, MASK), st.integers(0, 254)),
                          st.tuples(st.just("far"), st.just(1 << 33), st.integers(0, 1000), st.just(0)),
                          st.tuples(st.just("take"), st.integers(0, 10**6), st.just(0), st.just(0)),
                          st.tuples(st.just("drain"), st.integers(0, 600), st.just(0), st.just(0))),
                max_size=300),
       st.integers(1, 8))
def test_keyed_columns_keep_what_a_dict_keeps(ops, drop_min):
    """Appends in key order, takes anywhere and from the front (the front dropped once it is
    most of the columns), keys spread wider than 32 bits: a dict of key -> (value, mark) says
    what must be there."""
    early = type("EarlyDrops", (KeyedColumns,), {"__slots__": (), "DROP_FRONT_MIN": drop_min})  # drops come often
    kc, model = early(), {}
    key = 10
    for op, a, value, mark in ops:
        if op in ("add", "far"):
            key += a
            kc.append(key, value, mark)
            model[key] = (value, mark)
        elif op == "take" and model:
            k = sorted(model)[a % len(model)]
            assert kc.take(kc.index(k)) == model.pop(k)[0]
            assert kc.index(k) == -1 and k not in kc
        elif op == "drain":
            for k in sorted(model)[:a]:
                assert kc.take(kc.index(k)) == model.pop(k)[0]
        assert len(kc) == len(model)
    assert [(k, v, m) for _i, k, v, m in kc.entries()] == [(k, v, m) for k, (v, m) in sorted(model.items())]
    for k in model:
        i = kc.index(k)
        assert i >= 0 and kc.marks[i] == model[k][1]
    assert kc.index(key + 1) == -1 and kc.index(-5) == -1
    kc.append(key + 1, 7)
    with pytest.raises(ValueError):
        kc.append(key + 1, 0)  # not above the last key, even once every entry was taken out
