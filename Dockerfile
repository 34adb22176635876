# hutch:latest — one hutch node per container (docs/deployment.md, "Containers").
#
#   make image                       # docker build -t hutch:latest .
#   docker run -d --name hutch -h node1 \
#     -p 5672:5672 -p 15672:15672 -p 15692:15692 -p 25672:25672 \
#     -v hutch-data:/var/lib/hutch \
#     -e HUTCH_DEFAULT_USER=admin -e HUTCH_DEFAULT_PASS=change-me hutch:latest
#
# The image is configured the way RabbitMQ's is: HUTCH_* environment variables (RABBITMQ_* in
# RabbitMQ's image), a configuration file at /etc/hutch/hutch.conf, data in the /var/lib/hutch
# volume, logs on standard output. The node runs as the unprivileged user `hutch`.

ARG DEBIAN_RELEASE=bookworm

# ---- build: the wheel, from the source tree
FROM debian:${DEBIAN_RELEASE}-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY src ./src
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/build/bin/pip wheel --no-cache-dir --no-deps -w /dist .

# ---- runtime: the wheel and its runtime dependencies (pinned by constraints.txt), nothing else
FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 999 hutch \
 && useradd --system --uid 999 --gid hutch --home-dir /var/lib/hutch --shell /usr/sbin/nologin hutch \
 && mkdir -p /var/lib/hutch /var/log/hutch /etc/hutch \
 && chown -R hutch:hutch /var/lib/hutch /var/log/hutch \
 && chmod 750 /var/lib/hutch
COPY --from=build /dist/*.whl /tmp/
COPY constraints.txt /tmp/constraints.txt
RUN python3 -m venv /opt/hutch \
 && /opt/hutch/bin/pip install --no-cache-dir -c /tmp/constraints.txt /tmp/hutch-*.whl \
 && rm -f /tmp/*.whl /tmp/constraints.txt \
 && ln -s /opt/hutch/bin/hutch /opt/hutch/bin/hutchctl /opt/hutch/bin/hutch-diagnostics /usr/local/bin/
COPY packaging/container.conf /etc/hutch/hutch.conf

# RabbitMQ's image: node "rabbit@<container host name>", data in /var/lib/rabbitmq, console logs.
# HOME is the data volume, so the cluster secret file (~/.hutch.cookie) survives restarts.
ENV HUTCH_NODENAME=hutch \
    HUTCH_CONFIG_FILE=/etc/hutch/hutch.conf \
    HUTCH_DATA_DIR=/var/lib/hutch/data \
    HUTCH_LOGS=- \
    HOME=/var/lib/hutch \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8

VOLUME /var/lib/hutch
WORKDIR /var/lib/hutch
USER hutch
# AMQP, management HTTP API, Prometheus metrics, inter-node (peer) links
EXPOSE 5672 15672 15692 25672
STOPSIGNAL SIGTERM
# tini reaps and forwards signals; `docker stop` gives the node its graceful SIGTERM shutdown
ENTRYPOINT ["/usr/bin/tini", "--", "hutch"]
CMD ["server"]
