"""Rates and sample histories from rings of samples (hutch.control.rates), as the management
API derives them: the rate between the last two samples, histories one sample per `incr`
newest first with avg and avg_rate, and several nodes' rings added up as step functions."""

from __future__ import annotations

import pytest

from hutch.control import rates


def ring(*points: tuple[int, int]) -> list[tuple[int, tuple]]:
    return [(ts, (v,)) for ts, v in points]


def test_rate_is_per_second_between_the_last_two_samples():
    r = ring((0, 0), (5000, 100), (10000, 150))
    assert rates.details(r, 0, None, 5000) == {"rate": 10.0}
    assert rates.details(ring((0, 7)), 0, None, 5000) == {"rate": 0.0}
    assert rates.details([], 0, None, 5000) == {"rate": 0.0}


def test_history_is_one_sample_per_incr_newest_first():
    r = ring((0, 0), (5000, 10), (10000, 30), (15000, 60))
    d = rates.details(r, 0, (10, 5), 5000)
    assert d["samples"] == [{"sample": 60, "timestamp": 15000}, {"sample": 30, "timestamp": 10000},
                            {"sample": 10, "timestamp": 5000}]
    assert d["avg"] == round((60 + 30 + 10) / 3, 1)
    assert d["avg_rate"] == 5.0  # (60 - 10) over 10 s
    assert d["rate"] == 6.0


def test_history_steps_back_to_the_newest_sample_at_or_before_each_point():
    r = ring((0, 1), (5000, 2), (10000, 3))
    d = rates.details(r, 0, (10, 2), 5000)  # points at 10000, 8000, 6000, 4000, 2000, 0
    assert [s["sample"] for s in d["samples"]] == [3, 2, 2, 1, 1, 1]
    d = rates.details(r, 0, (60, 5), 5000)  # the ring starts at 0: nothing older is made up
    assert [s["timestamp"] for s in d["samples"]] == [10000, 5000, 0]


def test_merge_adds_up_nodes_as_step_functions():
    a = ring((0, 10), (5000, 20), (10000, 30))
    b = ring((5000, 100))  # this node's sample for 10000 has not been taken yet
    merged = rates.merge([a, b])
    assert merged == [(0, (10,)), (5000, (120,)), (10000, (130,))]
    assert rates.merge([a]) == a and rates.merge([[], []]) == []


def test_deliver_get_adds_deliveries_and_gets():
    counts = [0] * len(rates.msgstats.FIELDS)
    for name, n in (("deliver", 3), ("deliver_no_ack", 4), ("get", 5), ("get_no_ack", 6), ("publish", 9)):
        counts[rates.msgstats.FIELDS.index(name)] = n
    out = rates.message_stats(rates.QUEUE, counts, [], rates.Window(), 5000)
    assert out["deliver_get"] == 18 and out["publish"] == 9 and "confirm" not in out
    assert out["deliver_get_details"] == {"rate": 0.0}
    assert "publish_confirm" not in rates.message_stats(rates.CHANNEL, counts, [], rates.Window(), 5000)


@pytest.mark.parametrize("query, reason", [
    ({"msg_rates_age": "x"}, "whole numbers"),
    ({"lengths_age": "10", "lengths_incr": "0"}, "lengths_incr must be between"),
    ({"msg_rates_age": "0"}, "msg_rates_age must be between"),
    ({"lengths_age": "5", "lengths_incr": "6"}, "lengths_incr must be between"),
    ({"msg_rates_age": str(rates.AGE_S_MAX + 1)}, "msg_rates_age must be between"),
])
def test_bad_windows_name_the_parameter(query, reason):
    with pytest.raises(ValueError, match=reason):
        rates.window_of(query)


def test_a_window_asks_peers_for_enough_samples():
    w = rates.window_of({"msg_rates_age": "60", "msg_rates_incr": "5"})
    assert w.msg_rates == (60, 5) and w.lengths is None and w.samples_wanted(5000) == 14
    assert w.samples_wanted(1000) == 62 and w.samples_wanted(100) == rates.SAMPLES_MAX
    assert rates.window_of({}).samples_wanted(5000) == 2


def test_configuration_keys_for_statistics_and_prometheus(tmp_path):
    from hutch.broker.broker import Config
    from hutch.server.config import ConfigError, apply_file

    path = tmp_path / "hutch.conf"
    path.write_text("prometheus.tcp.port = 0\ncollect_statistics_interval = 250\nprometheus.tcp.ip = 127.0.0.1\n")
    cfg = apply_file(Config(), path)
    assert (cfg.prometheus_port, cfg.collect_statistics_interval_ms, cfg.prometheus_host) == (0, 250, "127.0.0.1")
    assert Config().prometheus_port == 15692 and Config().collect_statistics_interval_ms == 5000
    for bad in ("prometheus.tcp.port = 70000", "collect_statistics_interval = 10", "prometheus.tcp.port = x"):
        path.write_text(bad + "\n")
        with pytest.raises(ConfigError, match=bad.split(" =")[0]):
            apply_file(Config(), path)
