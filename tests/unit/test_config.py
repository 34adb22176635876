"""The configuration file as RabbitMQ's parser (cuttlefish) reads rabbitmq.conf: comments and
quoted values, the log.* and management.* keys, pause_if_all_down, legacy partition keys
(seed 003, "Deprecated rabbitmq.conf Keys"), and errors that name the line and the key."""

from __future__ import annotations

import socket

import pytest

from hutch.broker.broker import Config
from hutch.server.config import ConfigError, apply_file, check, complete_node_name


def load(tmp_path, text: str) -> Config:
    path = tmp_path / "hutch.conf"
    path.write_text(text)
    return apply_file(Config(), path)


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text)
    return str(e.value)


# ---------------------------------------------------------------- comments and values


def test_a_hash_glued_to_a_value_starts_a_comment_as_in_cuttlefish(tmp_path):
    # RabbitMQ 3.10.8's conf_parse gives [{["default_pass"],"pa"}] for this line
    cfg = load(tmp_path, "default_pass = pa#ss\n")
    assert cfg.default_pass == "pa"
    assert any("'default_pass'" in w and "single quotes" in w and ":1:" in w for w in cfg.config_warnings)


def test_a_single_quoted_value_keeps_its_hash(tmp_path):
    cfg = load(tmp_path, "default_pass = 'pa#ss' # the password\ndefault_user = 'bob'\n")
    assert cfg.default_pass == "pa#ss"
    assert cfg.default_user == "bob"
    assert cfg.config_warnings == []


def test_comment_lines_and_trailing_comments_after_whitespace_are_ignored_quietly(tmp_path):
    cfg = load(tmp_path, "# a comment\n   # an indented one\n\n\t\nheartbeat = 30   # seconds\n"
                         "cluster_name = east\t# tab before\n")
    assert cfg.heartbeat_s == 30
    assert cfg.cluster_name == "east"
    assert cfg.config_warnings == []


def test_a_line_without_equals_names_its_line(tmp_path):
    msg = error_of(tmp_path, "heartbeat = 30\nthis is not a setting\n")
    assert ":2:" in msg and "key = value" in msg


def test_an_unclosed_quote_is_an_error(tmp_path):
    assert "no closing quote" in error_of(tmp_path, "default_pass = 'abc\n")


def test_an_empty_value_is_an_error(tmp_path):
    msg = error_of(tmp_path, "default_pass = # nothing\n")
    assert ":1:" in msg and "'default_pass' has no value" in msg


def test_an_unknown_key_is_named_with_its_line(tmp_path):
    msg = error_of(tmp_path, "heartbeat = 30\n# comment\nqueue_index_embed_msgs_below = 4096\n")
    assert ":3:" in msg and "unknown configuration key 'queue_index_embed_msgs_below'" in msg


def test_a_bad_value_names_key_and_line(tmp_path):
    msg = error_of(tmp_path, "\nheartbeat = soon\n")
    assert ":2:" in msg and "bad value for 'heartbeat'" in msg


def test_mirroring_sync_background_is_a_boolean(tmp_path):
    assert load(tmp_path, "mirroring_sync_background = true\n").mirroring_sync_background is True
    assert load(tmp_path, "mirroring_sync_background = false\n").mirroring_sync_background is False
    assert Config().mirroring_sync_background is False  # RabbitMQ's blocking sync by default
    assert "bad value for 'mirroring_sync_background'" in error_of(tmp_path, "mirroring_sync_background = soon\n")


def test_stream_fsync_takes_its_two_modes(tmp_path):
    assert Config().stream_fsync == "before_confirm"
    assert load(tmp_path, "stream.fsync = background\n").stream_fsync == "background"
    assert load(tmp_path, "stream.fsync = before_confirm\n").stream_fsync == "before_confirm"
    msg = error_of(tmp_path, "stream.fsync = never\n")
    assert "bad value for 'stream.fsync'" in msg and "before_confirm, background" in msg


# ---------------------------------------------------------------- log.*


def test_log_file_keys_are_accepted_and_passed_through(tmp_path):
    cfg = load(tmp_path, "log.file = hutch.log\nlog.file.level = debug\nlog.file.rotation.size = 10485760\n"
                         "log.file.rotation.count = 5\nlog.file.formatter = json\nlog.console = true\n"
                         "log.console.level = warning\nlog.connection.level = error\nlog.dir = /tmp\n")
    assert cfg.log_settings == {"log.file": "hutch.log", "log.file.level": "debug",
                                "log.file.rotation.size": "10485760", "log.file.rotation.count": "5",
                                "log.file.formatter": "json", "log.console": "true",
                                "log.console.level": "warning", "log.connection.level": "error", "log.dir": "/tmp"}
    assert cfg.log_level == "warning"


def test_log_file_false_turns_the_file_off(tmp_path):
    assert load(tmp_path, "log.file = false\n").log_settings["log.file"] == "false"


@pytest.mark.parametrize("line, words", [
    ("log.file.level = loud", "bad value for 'log.file.level'"),
    ("log.file.rotation.size = 10MB", "bad value for 'log.file.rotation.size'"),
    ("log.file.formatter = xml", "expected plaintext or json"),
    ("log.file.colour = red", "unknown configuration key 'log.file.colour'"),
    ("log.nonsense.level = info", "unknown configuration key 'log.nonsense.level'"),
])
def test_bad_log_keys_are_refused(tmp_path, line, words):
    msg = error_of(tmp_path, line + "\n")
    assert words in msg and ":1:" in msg


# ---------------------------------------------------------------- management.*


def test_management_tcp_ip_and_port(tmp_path):
    cfg = load(tmp_path, "management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = 15999\n")
    assert (cfg.mgmt_host, cfg.mgmt_port, cfg.mgmt_tcp_configured) == ("127.0.0.1", 15999, True)


def test_management_tcp_ip_must_be_an_address(tmp_path):
    assert "not an IP address" in error_of(tmp_path, "management.tcp.ip = localhost\n")


def test_management_ssl_keys(tmp_path):
    cfg = load(tmp_path, "management.ssl.port = 15671\nmanagement.ssl.certfile = s.pem\n"
                         "management.ssl.keyfile = s.key\nmanagement.ssl.cacertfile = ca.pem\n"
                         "management.ssl.verify = verify_peer\nmanagement.ssl.fail_if_no_peer_cert = true\n"
                         "management.ssl.ip = ::1\n")
    assert cfg.mgmt_ssl_port == 15671 and cfg.mgmt_ssl_host == "::1"
    assert (cfg.mgmt_tls_certfile, cfg.mgmt_tls_keyfile, cfg.mgmt_tls_cacertfile) == ("s.pem", "s.key", "ca.pem")
    assert cfg.mgmt_tls_verify_peer and cfg.mgmt_tls_fail_if_no_peer_cert
    assert not cfg.mgmt_tcp_configured


def test_management_ssl_port_without_a_certificate_is_refused(tmp_path):
    msg = error_of(tmp_path, "heartbeat = 10\nmanagement.ssl.port = 15671\n")
    assert ":2:" in msg and "management.ssl.certfile" in msg


def test_unknown_management_ssl_key(tmp_path):
    assert "unknown configuration key 'management.ssl.sparkle'" in error_of(tmp_path, "management.ssl.sparkle = 1\n")


# ---------------------------------------------------------------- partition handling


def test_pause_if_all_down_with_nodes_and_recover(tmp_path):
    cfg = load(tmp_path, "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n"
                         "cluster_partition_handling = pause_if_all_down\n"
                         "cluster_partition_handling.pause_if_all_down.nodes.2 = hutch@b\n"
                         "cluster_partition_handling.pause_if_all_down.recover = autoheal\n")
    assert cfg.cluster_partition_handling == "pause_if_all_down"
    assert cfg.pause_if_all_down_nodes == ["hutch@a", "hutch@b"]
    assert cfg.pause_if_all_down_recover == "autoheal"
    assert cfg.config_warnings == []


def test_pause_if_all_down_needs_nodes(tmp_path):
    msg = error_of(tmp_path, "cluster_partition_handling = pause_if_all_down\n"
                             "cluster_partition_handling.pause_if_all_down.recover = ignore\n")
    assert ":1:" in msg and "nodes.1" in msg


def test_pause_if_all_down_needs_a_recover_strategy(tmp_path):
    msg = error_of(tmp_path, "cluster_partition_handling = pause_if_all_down\n"
                             "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n")
    assert "recover = ignore | autoheal" in msg


def test_recover_must_be_ignore_or_autoheal_and_the_error_names_its_line(tmp_path):
    msg = error_of(tmp_path, "cluster_partition_handling = pause_if_all_down\n"
                             "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n"
                             "cluster_partition_handling.pause_if_all_down.recover = restart\n")
    assert ":3:" in msg and "expected one of ignore, autoheal, got 'restart'" in msg


def test_a_watched_node_must_be_a_node_name(tmp_path):
    msg = error_of(tmp_path, "cluster_partition_handling = pause_if_all_down\n"
                             "cluster_partition_handling.pause_if_all_down.recover = ignore\n"
                             "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n"
                             "cluster_partition_handling.pause_if_all_down.nodes.2 = nohost\n")
    assert ":4:" in msg and "node 'nohost' must be NAME@HOST" in msg


def test_legacy_keys_load_whatever_their_values_under_another_mode(tmp_path):
    cfg = load(tmp_path, "cluster_partition_handling = pause_minority\n"
                         "cluster_partition_handling.pause_if_all_down.nodes.1 = nohost\n"
                         "cluster_partition_handling.pause_if_all_down.recover = restart\n")
    assert cfg.cluster_partition_handling == "pause_minority"
    assert len(cfg.config_warnings) == 2


@pytest.mark.parametrize("mode", ["ignore", "pause_minority", "autoheal"])
def test_legacy_pause_if_all_down_keys_load_without_effect_in_other_modes(tmp_path, mode):
    cfg = load(tmp_path, f"cluster_partition_handling = {mode}\n"
                         "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n"
                         "cluster_partition_handling.pause_if_all_down.recover = ignore\n")
    assert cfg.cluster_partition_handling == mode
    assert len(cfg.config_warnings) == 2
    assert all("has no effect" in w and mode in w for w in cfg.config_warnings)


def test_legacy_keys_without_a_mode_line_also_load(tmp_path):
    cfg = load(tmp_path, "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n")
    assert cfg.cluster_partition_handling == "ignore"
    assert any("nodes.*" in w for w in cfg.config_warnings)


def test_check_is_idempotent_for_warnings(tmp_path):
    cfg = load(tmp_path, "cluster_partition_handling.pause_if_all_down.nodes.1 = hutch@a\n")
    check(cfg)
    assert len(cfg.config_warnings) == 1


def test_an_unknown_partition_handling_mode_is_refused(tmp_path):
    assert "expected one of" in error_of(tmp_path, "cluster_partition_handling = split_brain\n")


# ---------------------------------------------------------------- node names


def test_node_name_without_host_gets_the_short_host_name():
    short = socket.gethostname().split(".")[0]
    assert complete_node_name("rabbit") == f"rabbit@{short}"
    assert complete_node_name("hutch@elsewhere") == "hutch@elsewhere"
