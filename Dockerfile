# syntax=docker/dockerfile:1
# The one image every role runs: operator, learner (Ray head + driver), rollout and aggregator
# nodes, and the status sidecar. Build: docker build -t impalajob:0.1.0 .
#
# Two stages: the build stage installs into a virtualenv, the runtime stage copies only that
# virtualenv, so compilers and pip caches never reach the image.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainer ./trainer
COPY operator ./operator
RUN python -m venv /opt/impalajob \
 && /opt/impalajob/bin/pip install .

FROM python:3.11-slim
COPY --from=build /opt/impalajob /opt/impalajob
# HOME is /tmp: pods run with a read-only root filesystem and an emptyDir on /tmp, where Ray's
# session directory and torch/gymnasium caches go.
ENV PATH=/opt/impalajob/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    RAY_USAGE_STATS_ENABLED=0
RUN groupadd --gid 1000 impala \
 && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin impala
# Numeric, so `runAsNonRoot: true` can verify it without resolving a user name.
USER 1000:1000
WORKDIR /tmp
# Ray GCS, raylet, object manager; status sidecar; operator metrics and health.
EXPOSE 6379 6380 6381 8080 9090 8081
ENTRYPOINT ["impalajob"]
CMD ["--help"]
