"""`hutch lab` on real processes: a 3-node lab on loopback, its proxies, its faults and its records.

One lab serves the tests of this module (starting nodes is the slow part); each test leaves it
as it found it: every node running, every link healed. Links are probed with raw TCP through
the lab's proxies: a probe speaks the first step of the peer handshake (wire.py's Hello) as
a dialler expecting the link's target node, so an open link answers with that node's
Challenge, a blackholed link answers nothing and a reset link is closed at once.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hutch.cluster.wire import HandshakeFailed, PeerCodec
from hutch.lab.cluster import (
    MGMT_PORT_OFFSET,
    ClockSkew,
    Lab,
    LabError,
    fault_history_rows,
    http_answers,
    port_in_use,
    process_state,
)
from tests.support.lab import free_base_port

NODES = 3
PROBE_TIMEOUT_S = 0.5  # an open link on loopback answers in milliseconds
HEALTHY_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab.up(NODES, tmp_path_factory.mktemp("lab") / "lab", base_port=free_base_port(NODES), wait="http",
                 tied_to_caller=True)
    try:
        yield lab
    finally:
        lab.down()


def probe(port: int, target: str, secret: str) -> str:
    """Raw TCP through a proxy: ``answered`` (the target node's Challenge came back), ``silent``
    or ``closed``."""
    codec = PeerCodec("lab-probe@localhost", secret, "dialler", expected_peer=target)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as s:
            s.sendall(codec.data_to_send())
            s.settimeout(PROBE_TIMEOUT_S)
            try:
                data = s.recv(4096)
            except TimeoutError:
                return "silent"
    except (ConnectionResetError, BrokenPipeError):  # a reset may come during connect or send already
        return "closed"
    if not data:
        return "closed"
    try:
        codec.feed(data)
    except HandshakeFailed as e:
        raise AssertionError(f"the proxy of a link to {target} reached another node: {e}") from None
    assert codec.state != "dialler_await_challenge", "a partial frame: read more"
    return "answered"


def probe_links(lab: Lab) -> dict[tuple[str, str], str]:
    secret = (lab.dir / "cluster-secret").read_text()
    return {(link["from"], link["to"]): probe(link["listen_port"], link["to"], secret) for link in lab.links()}


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
    return result


def proc_stat_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def new_faults(lab: Lab, before: int) -> list[dict]:
    return lab.faults()[before:]


# -- starting a lab


def test_up_starts_each_node_on_its_ports_with_a_shared_secret(lab):
    base = lab.info()["base_port"]
    rows = lab.status()
    assert [r["name"] for r in rows] == ["hutch-1@localhost", "hutch-2@localhost", "hutch-3@localhost"]
    for i, r in enumerate(rows):
        assert (r["amqp_port"], r["mgmt_port"], r["peer_port"]) == (base + i, base + 10000 + i, base + 20000 + i)
        assert r["state"] == "running" and r["http"]
        assert r["amqp_url"] == f"amqp://guest:guest@127.0.0.1:{base + i}/%2F"
        assert (lab.dir / f"hutch-{i + 1}" / "console.log").exists()
    secret = lab.dir / "cluster-secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_text()) >= 32
    for n in lab.info()["nodes"]:
        cmd = n["command"]
        assert cmd[cmd.index("--cluster-secret-file") + 1] == str(secret)
        assert cmd[cmd.index("--cluster-nodes") + 1] == ",".join(
            f"hutch-{i + 1}@localhost:{base + 20000 + i}" for i in range(NODES))
        assert cmd[cmd.index("--net-ticktime") + 1] == "4"


def test_every_directed_peer_link_passes_through_its_own_proxy(lab):
    info = lab.info()
    links = lab.links()
    peer_port = {n["name"]: n["peer_port"] for n in info["nodes"]}
    assert sorted((x["from"], x["to"]) for x in links) == sorted(
        (a, b) for a in peer_port for b in peer_port if a != b)
    assert len({x["listen_port"] for x in links}) == NODES * (NODES - 1)
    for link in links:
        assert link["target_port"] == peer_port[link["to"]]
        # The dialling node is told to reach its peer at the proxy.
        cmd = next(n["command"] for n in info["nodes"] if n["name"] == link["from"])
        assert f"{link['to']}=127.0.0.1:{link['listen_port']}" in cmd
    assert set(probe_links(lab).values()) == {"answered"}


def test_up_refuses_a_second_lab_in_the_same_directory(lab):
    with pytest.raises(LabError, match="already running"):
        Lab.up(NODES, lab.dir, base_port=free_base_port(NODES), wait="none")


def test_up_refuses_a_port_that_is_taken(tmp_path):
    base = free_base_port(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + MGMT_PORT_OFFSET + 1))
        s.listen()
        with pytest.raises(LabError, match=rf"port {base + MGMT_PORT_OFFSET + 1} \(HTTP port of hutch-2@localhost\)"):
            Lab.up(2, tmp_path / "lab", base_port=base, wait="none")
    assert not (tmp_path / "lab" / "lab.json").exists()


def test_a_node_gets_another_hosts_clock_from_its_next_start(tmp_path):
    lab = Lab.up(2, tmp_path / "lab", base_port=free_base_port(2), wait="http", tied_to_caller=True,
                 clocks={"hutch-2": ClockSkew(wall_offset_ms=1500, boot_offset_s=86400)})
    try:
        def environ(i: int) -> dict[str, str]:
            raw = Path(f"/proc/{lab.pid_of(i)}/environ").read_bytes().split(b"\0")
            return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)

        assert {k: v for k, v in environ(2).items() if k.startswith("HUTCH_FAULT_")} == {
            "HUTCH_FAULT_WALL_OFFSET_MS": "1500.0", "HUTCH_FAULT_BOOT_OFFSET_S": "86400.0"}
        assert not any(k.startswith("HUTCH_FAULT_") for k in environ(1))
        lab.kill(2)
        lab.start(2)  # a restart keeps the skew
        assert environ(2)["HUTCH_FAULT_WALL_OFFSET_MS"] == "1500.0"
    finally:
        lab.down(wipe=True)


def test_up_names_a_clock_it_cannot_read():
    r = subprocess.run([sys.executable, "-m", "hutch", "lab", "up", "2", "--clock", "hutch-2=soon"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "'hutch-2=soon' is not NODE=WALL_MS or NODE=WALL_MS,BOOT_S" in r.stderr


def test_node_names_are_accepted_short_full_or_by_index(lab):
    assert lab.node("hutch-2").name == lab.node("hutch-2@localhost").name == lab.node(2).name == "hutch-2@localhost"
    with pytest.raises(LabError, match="no node '4'"):
        lab.node(4)


# -- network faults


def test_partition_cuts_every_link_between_the_named_node_and_the_rest_in_both_directions(lab):
    before = len(lab.faults())
    lab.partition("hutch-1")
    try:
        seen = probe_links(lab)
        for (a, b), result in seen.items():
            across = ("hutch-1@localhost" in (a, b))
            assert result == ("silent" if across else "answered"), (a, b, result)
    finally:
        lab.heal()
    assert set(probe_links(lab).values()) == {"answered"}
    partition, heal = new_faults(lab, before)
    assert partition["fault"] == "partition" and partition["nodes"] == ["hutch-1@localhost"]
    assert partition["rest"] == ["hutch-2@localhost", "hutch-3@localhost"] and partition["mode"] == "blackhole"
    assert len(partition["links"]) == 4
    assert heal["fault"] == "heal" and heal["windows"] == ["end partition healed"]


def test_partition_of_two_nodes_keeps_the_link_between_them(lab):
    lab.partition("hutch-1", "hutch-2", mode="reset")
    try:
        seen = probe_links(lab)
        for (a, b), result in seen.items():
            across = ("hutch-3@localhost" in (a, b))
            assert result == ("closed" if across else "answered"), (a, b, result)
    finally:
        lab.heal()
    assert set(probe_links(lab).values()) == {"answered"}


def probe_round_trip_s(port: int, target: str, secret: str) -> float:
    codec = PeerCodec("lab-probe@localhost", secret, "dialler", expected_peer=target)
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as s:
        started = time.monotonic()
        s.sendall(codec.data_to_send())
        assert s.recv(4096)
        return time.monotonic() - started


def test_delay_slows_both_directions_between_two_nodes_and_heal_removes_it(lab):
    before = len(lab.faults())
    secret = (lab.dir / "cluster-secret").read_text()
    lab.delay(1, "hutch-3", 150)
    try:
        for link in lab.links():
            rtt_s = probe_round_trip_s(link["listen_port"], link["to"], secret)
            if {link["from"], link["to"]} == {"hutch-1@localhost", "hutch-3@localhost"}:
                assert link["delay_ms"] == 150
                assert rtt_s >= 0.3  # 150 ms on the way in and 150 ms on the way back
            else:
                assert link["delay_ms"] == 0 and rtt_s < 0.3
    finally:
        lab.heal()
    assert all(link["delay_ms"] == 0 for link in lab.links())
    delay, heal = new_faults(lab, before)
    assert (delay["fault"], delay["nodes"], delay["delay_ms"]) == ("delay", ["hutch-1@localhost", "hutch-3@localhost"], 150)
    assert delay["windows"] == ["start delay-hutch-1-hutch-3 150 ms hutch-1@localhost <-> hutch-3@localhost"]
    assert heal["windows"] == ["end delay-hutch-1-hutch-3 healed"]


# -- process faults


def test_kill_then_start_runs_the_same_command_line_again(lab):
    before = len(lab.faults())
    old_pid = lab.pid_of(2)
    command = next(n["command"] for n in lab.info()["nodes"] if n["name"] == "hutch-2@localhost")
    lab.kill("hutch-2")
    assert process_state(old_pid) == "stopped"
    assert lab.status()[1]["state"] == "stopped" and not http_answers(lab.node(2))
    with pytest.raises(LabError, match=r"hutch-2@localhost \(pid \d+\) exited; its console log .*hutch-2/console.log"):
        lab.wait_http(2, timeout_s=1)
    with pytest.raises(LabError, match="not running"):
        lab.suspend(2)
    lab.start(2)  # returns once its HTTP API answers
    new_pid = lab.pid_of(2)
    assert new_pid != old_pid and lab.status()[1]["state"] == "running" and http_answers(lab.node(2))
    assert Path(f"/proc/{new_pid}/cmdline").read_bytes().split(b"\0")[:-1][1:] == [c.encode() for c in command[1:]]
    with pytest.raises(LabError, match="is running"):
        lab.start(2)
    kill, start = new_faults(lab, before)
    assert (kill["fault"], kill["signal"], kill["pid"]) == ("kill", "SIGKILL", old_pid)
    assert (start["fault"], start["pid"]) == ("start", new_pid)
    assert kill["windows"] == ["start kill-hutch-2 kill -9 hutch-2@localhost"]
    assert start["windows"] == ["end kill-hutch-2 started"]


def test_stop_is_a_graceful_sigterm_that_waits_for_the_exit(lab):
    pid = lab.pid_of("hutch-3@localhost")
    rec = lab.stop(3)
    assert (rec["fault"], rec["signal"], rec["graceful"], rec["exit_code"]) == ("stop", "SIGTERM", True, 0)
    assert process_state(pid) == "stopped"
    lab.start(3)
    assert lab.status()[2]["state"] == "running"


def test_suspend_stops_the_process_and_resume_continues_it(lab):
    before = len(lab.faults())
    pid = lab.pid_of(1)
    lab.suspend(1)
    try:
        assert proc_stat_state(pid) == "T"
        assert lab.status()[0]["state"] == "suspended"
    finally:
        lab.resume(1)
    assert proc_stat_state(pid) in ("R", "S")
    assert lab.status()[0]["state"] == "running" and lab.pid_of(1) == pid
    suspend, resume = new_faults(lab, before)
    assert (suspend["fault"], suspend["signal"], resume["fault"], resume["signal"]) == (
        "suspend", "SIGSTOP", "resume", "SIGCONT")


# -- the fault record


def test_faults_jsonl_has_one_timestamped_line_per_fault_that_histories_can_join(lab):
    before = len(lab.faults())
    t0_ms = time.time_ns() // 1_000_000
    lab.partition(2)
    lab.suspend(3)
    lab.resume(3)
    lab.heal()
    t1_ms = time.time_ns() // 1_000_000
    lines = (lab.dir / "faults.jsonl").read_text().splitlines()[before:]
    records = [json.loads(line) for line in lines]
    assert [r["fault"] for r in records] == ["partition", "suspend", "resume", "heal"]
    times = [r["time_ms"] for r in records]
    assert t0_ms <= times[0] and times == sorted(times) and times[-1] <= t1_ms
    assert all(r["kind"] == r["op"] == "fault" and r["ts_ns"] // 1_000_000 == r["time_ms"] for r in records)

    # Into a history as `fault` rows whose windows the checker understands.
    from hutch.pipeline.history import parse_fault
    from hutch.pipeline.model import fault_events, fault_windows

    rows = list(fault_history_rows(lab.dir / "faults.jsonl"))
    events = fault_events([("run", ts, detail) for ts, detail in rows if ts >= records[0]["ts_ns"]])
    assert [parse_fault(e.detail) for e in events] == [
        ("start", "partition"), ("start", "suspend-hutch-3"), ("end", "suspend-hutch-3"), ("end", "partition")]
    windows = fault_windows(events, {"run": records[-1]["ts_ns"]})
    assert {(w.name, w.start_ns, w.end_ns) for w in windows} == {
        ("partition", records[0]["ts_ns"], records[3]["ts_ns"]),
        ("suspend-hutch-3", records[1]["ts_ns"], records[2]["ts_ns"])}


# -- the cluster itself (needs clustered nodes)


def test_the_lab_cluster_becomes_healthy_with_one_leader_every_node_agrees_on(lab):
    lab.wait_healthy(HEALTHY_TIMEOUT_S)
    assert set(lab.health().values()) == {None}
    from hutch.lab.cluster import cluster_view

    views = [cluster_view(n) for n in lab.nodes]
    assert len({v["leader"] for v in views}) == 1 and views[0]["leader"] in [n.name for n in lab.nodes]


def test_a_partitioned_node_loses_its_peers_and_the_cluster_heals_after_heal(lab):
    lab.wait_healthy(HEALTHY_TIMEOUT_S)
    lab.partition(3, mode="reset")
    try:
        from hutch.lab.cluster import cluster_view

        def isolated_and_majority_leader():
            alone, a = cluster_view(lab.node(3)), cluster_view(lab.node(1))
            return (isinstance(alone, dict) and alone["running_nodes"] == ["hutch-3@localhost"]
                    and isinstance(a, dict) and "hutch-3@localhost" not in a["running_nodes"]
                    and a["leader"] in ("hutch-1@localhost", "hutch-2@localhost"))
        wait_for(isolated_and_majority_leader, HEALTHY_TIMEOUT_S, "hutch-3 isolated, majority with a leader")
        with pytest.raises(LabError, match=r"not healthy after 0.2 s: hutch-\d@localhost is not up \(it does not see "
                                           r"hutch-.* running\); see its log .*/hutch-\d/console.log"):
            lab.wait_healthy(0.2)
    finally:
        lab.heal()
    lab.wait_healthy(HEALTHY_TIMEOUT_S)


# -- the command line, and stopping


def hutch_lab(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hutch", "lab", *args], capture_output=True, text=True,
                          check=check, timeout=60)


def test_the_cli_lab_outlives_its_command_and_down_leaves_no_process(tmp_path):
    lab_dir = tmp_path / "cli-lab"
    base = free_base_port(2)
    up = hutch_lab("up", "2", "--base-port", str(base), "--dir", str(lab_dir))  # waits until healthy
    assert "(healthy, catalogue leader hutch-" in up.stdout
    assert f"amqp://guest:guest@127.0.0.1:{base}/%2F" in up.stdout and "hutch lab down" in up.stdout
    lab = Lab(lab_dir)
    try:
        info = lab.info()
        # `hutch lab up` has exited; its controller and nodes are still there.
        pids = [info["controller"]["pid"]] + [n["pid"] for n in info["nodes"]]
        assert all(process_state(p) == "running" for p in pids)
        status = json.loads(hutch_lab("status", "--json", "--dir", str(lab_dir)).stdout)
        assert status["controller_running"] and [n["state"] for n in status["nodes"]] == ["running", "running"]
        table = hutch_lab("status", "--dir", str(lab_dir)).stdout
        assert "hutch-2@localhost" in table and "running" in table
        assert "kill hutch-1@localhost" in hutch_lab("kill", "1", "--dir", str(lab_dir)).stdout
        refused = hutch_lab("resume", "hutch-1", "--dir", str(lab_dir), check=False)
        assert refused.returncode == 1 and "hutch-1@localhost is not running" in refused.stderr
    finally:
        down = hutch_lab("down", "--dir", str(lab_dir))
    assert "stopped the lab controller" in down.stdout
    assert all(process_state(p) == "stopped" for p in pids)
    assert not any(port_in_use(p) for p in (base, base + 1, base + 10000, base + 10001, base + 20000, base + 20001))
    assert not any(port_in_use(link["listen_port"]) for link in info["links"])
    assert (lab_dir / "hutch-1").is_dir()  # data is kept
    hutch_lab("down", "--wipe", "--dir", str(lab_dir))
    assert not lab_dir.exists()


def test_down_stops_every_node_and_the_controller(tmp_path):
    lab = Lab.up(2, tmp_path / "lab", base_port=free_base_port(2), wait="http", tied_to_caller=True)
    info = lab.info()
    lab.suspend(2)  # a suspended node must be stopped too
    pids = [info["controller"]["pid"]] + [lab.pid_of(1), lab.pid_of(2)]
    lab.down()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} left behind"
    assert not lab.controller_running()
    with pytest.raises(LabError, match="not running"):
        lab.kill(1)


def test_a_lab_tied_to_its_caller_stops_when_the_caller_is_killed(tmp_path):
    lab_dir = tmp_path / "tied"
    code = ("import os, signal; from hutch.lab.cluster import Lab; "
            f"Lab.up(2, {str(lab_dir)!r}, base_port={free_base_port(2)}, wait='http', tied_to_caller=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    caller = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert caller.returncode == -9, caller.stderr
    info = Lab(lab_dir).info()
    pids = [info["controller"]["pid"]] + [n["pid"] for n in info["nodes"]]
    wait_for(lambda: all(process_state(p) == "stopped" for p in pids), 20, "the lab to stop with its caller")
    assert "exited with 0" in (lab_dir / "controller.log").read_text()  # the nodes were stopped gracefully
