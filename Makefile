# hutch — every target bootstraps what it needs (virtualenv, PyPI and Debian packages).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# pyproject.toml declares version ranges, constraints.txt pins the exact versions: a change to either reinstalls.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)

.PHONY: install bytecode wheel-check image run run-node test test-fast test-unit test-integration lint bench bench-cluster bench-quorum bench-streams bench-mirror bench-backlog conformance soak check-demo pipeline-demo bench-spark clean campaign campaign-long sim-cluster

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@command -v java >/dev/null 2>&1 || { echo "installing a Java runtime for PySpark (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless) >/dev/null; }
	@command -v chromedriver >/dev/null 2>&1 || { echo "installing chromium and chromedriver for the web UI tests (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,pipeline,lab]'
	@rm -f $(VENV)/.installed-*; touch $@

# Compiled modules for hutch's own source. Where PYTHONDONTWRITEBYTECODE is set (as on these
# machines), Python never caches them, so every node process, CLI call and test subprocess would
# compile all of hutch again: about 0.45 s of CPU each, and a 3-node cluster starts in 1.3 s
# instead of 3 s with them. Only what changed is compiled again; a stale file is never used.
bytecode: install
	@$(BIN)/python -m compileall -q -j 0 -x '/cache/' src tests bench >/dev/null

# The main job: a 3-node hutch cluster on loopback (AMQP 5672-5674, HTTP API 15672-15674, peer
# links 25672-25674 through the lab's fault proxies), data under ./var/lab. Stop it with
# `.venv/bin/hutch lab down`; `make run-node` runs one standalone node in the foreground instead.
run: bytecode
	$(BIN)/hutch lab up 3 --dir ./var/lab

run-node: bytecode
	$(BIN)/hutch server --node-name hutch@localhost --amqp-port 5672 --data-dir ./var/hutch --log-level info

# Fast unit tests and the simulations first, then the suites that start real processes, the
# client libraries' suites, the short campaigns and the rest of the simulation sweep beside them
# (tools/test_all.sh says why).
test: bytecode
	tools/test_all.sh

# The package as a user gets it (docs/deployment.md): build the wheel, install it with only its
# runtime dependencies (pinned by constraints.txt) into a fresh virtualenv, start a node from it,
# check that it answers AMQP, stop it. The same check runs in `make test` (tests/packaging).
wheel-check: install
	$(BIN)/python -m tests.packaging.wheel_check

# The container image (Dockerfile, docs/deployment.md). Needs Docker with a running daemon.
image:
	@command -v docker >/dev/null 2>&1 || { echo "make image: Docker is required (the docker command is not installed)" >&2; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "make image: Docker is required, and its daemon is not running or not reachable" >&2; exit 1; }
	docker build -t hutch:latest .

test-unit: bytecode
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit tests/sim

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/python tools/import_cycles.py

bench: install
	$(BIN)/python bench/compare

# Throughput on 3-node clusters (RabbitMQ and hutch): clients on the queue's home node vs another node.
bench-cluster: install
	$(BIN)/python bench/cluster_compare

# Quorum queues on 3-node clusters (RabbitMQ and hutch): throughput, latency at 1,000 msg/s, leader failover.
bench-quorum: install
	$(BIN)/python bench/quorum_compare

# Streams (RabbitMQ and hutch, 1 and 3 replicas): AMQP 0-9-1 and stream-protocol throughput, catch-up
# from first (--catchup N, default 1,000,000), time to resume after kill -9 of the leader's node.
bench-streams: install
	$(BIN)/python bench/streams_compare.py

# Classic mirrored queues on 3-node clusters (RabbitMQ and hutch): throughput, sync time and blocking, failover.
bench-mirror: install
	$(BIN)/python bench/mirror_compare

# A backlog far larger than memory (docs/performance.md, "Backlogs"): 20,000,000 persistent 1 KiB messages
# published with confirms to one durable queue, kill -9 with the queue full, then drained; hutch, RabbitMQ
# default mode and RabbitMQ lazy, one after the other. Needs about 22 GiB of free disk and hours;
# BENCH_BACKLOG_ARGS='--messages 1000000' for a run of minutes.
bench-backlog: install
	$(BIN)/python bench/backlog.py $(BENCH_BACKLOG_ARGS)

check-demo: install
	$(BIN)/python bench/check_demo.py

# Exactly once from a stream through Spark and back (docs/spark.md, "Exactly-once demo"): a 3-node lab,
# `hutch perf` into a stream, a Structured Streaming job to Parquet and to another stream, kill -9 of a
# node and of the Spark driver, the job restarted from its checkpoints, every message checked with Spark.
# About 3 minutes. PIPELINE_DEMO_ARGS='--master spark' runs the job on a Spark standalone cluster.
pipeline-demo: install
	$(BIN)/python bench/pipeline/demo.py $(PIPELINE_DEMO_ARGS)

# The Spark connector's throughput (docs/performance.md, "Spark connector"): 10,000,000 messages read
# into Spark on local[2] and written back, super streams of 1, 2 and 4 partitions. 10-15 minutes;
# BENCH_SPARK_ARGS='--messages 1000000' for a quicker run.
bench-spark: install
	$(BIN)/python bench/spark_connector.py $(BENCH_SPARK_ARGS)

# Jepsen-style fault campaign on quorum queues (docs/lab.md, "Fault campaigns"): seeds 1-3, 200 s
# of faults each on a fresh 3-node lab (base port 7672), then the Spark checker on every history.
# Results in ./var/campaign/seed-N/ (campaign.json, history/, check/, lab/ with the node logs).
campaign: install
	rc=0; $(BIN)/hutch lab campaign --seed 1 --seed 2 --seed 3 --duration 200 --out ./var/campaign \
	  --base-port 7672 || rc=$$?; \
	for s in 1 2 3; do $(BIN)/hutch check ./var/campaign/seed-$$s/history --out ./var/campaign/seed-$$s/check \
	  --expect drained=1 --expect lost=0 --expect unexpected=0 || rc=1; done; exit $$rc

# 100 randomised fault campaigns of 60 s (docs/reliability.md): quorum, mirrored (ha-mode all /
# exactly 2, when-synced), streams, durable classic queues without mirrors in turn, every fault kind including fsync errors and a full disk,
# on fresh 3-node labs (base port 8672); resumable (runs in ./var/campaign-long/runs.jsonl are
# skipped). The table goes into docs/reliability.md; then the Spark checker reads every history.
campaign-long: install
	rc=0; $(BIN)/hutch lab campaign-long --runs 100 --duration 60 --out ./var/campaign-long --base-port 8672 \
	  --table docs/reliability.md || rc=$$?; \
	$(BIN)/hutch check ./var/campaign-long --out ./var/campaign-long/_check --expect drained=1 --expect lost=0 \
	  --expect unexpected=0 || rc=1; exit $$rc

# The simulators' long runs: the Raft simulator over a million seeds, then the whole-cluster
# simulation over SOAK_CLUSTER_SEEDS seeds of each of its ten queue types (every fault and client
# kind; seeds from 1000, past the ones make test runs) on every core: a million cluster seeds,
# about two days on two cores. Each failure prints the command that replays it.
SOAK_CLUSTER_SEEDS ?= 100000
SIM_QUEUE_TYPES := quorum classic mirrored mirrored-always mirrored-nodes mirrored-automatic-always stream \
  stream-protocol transient exclusive
soak: install
	$(BIN)/python -m hutch.raft.sim raft --seed 1 --seeds 1000000
	rc=0; for t in $(SIM_QUEUE_TYPES); do \
	  $(BIN)/hutch sim cluster --seed 1000 --seeds $(SOAK_CLUSTER_SEEDS) --queue-type $$t --jobs 0 || rc=1; done; exit $$rc

# Real nodes in one process on simulated time and network (docs/design/simulation.md): the wide
# sweep, 2,530 seeds of every queue type and mirroring configuration under every fault kind and
# client kind, on every core (about 6 minutes on two); each failure prints the command that replays
# it. `make test` runs them too: 290 first, the rest beside the real-process suites.
sim-cluster: install
	HUTCH_SIM_SEEDS=wide $(BIN)/python -m pytest -q -p no:cacheprovider tests/sim/test_cluster_sim.py

conformance: install
	$(BIN)/python -m tests.conformance.run --both

conformance-hutch: install
	$(BIN)/python -m tests.conformance.run --broker hutch --check-expected

conformance-tls: install
	$(BIN)/python -m tests.conformance.run --broker rabbitmq --tls --suites aiormq,aio-pika
	$(BIN)/python -m tests.conformance.run --broker hutch --tls --suites aiormq,aio-pika

clean:
	rm -rf var .pytest_cache build *.egg-info
