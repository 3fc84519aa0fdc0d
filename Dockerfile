# syntax=docker/dockerfile:1
# The one image every role runs: operator, learner (Ray head + driver), rollout and aggregator
# nodes, and the status sidecar.
#
#   docker build -t impalajob:0.1.0 .                 # with Docker
#   bash hack/build-image.sh                          # without Docker: buildah + a Debian base
#
# BASE_IMAGE is any Debian-like image with `python3` (3.11+) and the `venv` module; the buildah
# script passes a bookworm base it makes with mmdebstrap, since no registry may be reachable.
#
# Two layers that matter: the dependencies (torch, Ray, ...: gigabytes, keyed by the lock alone)
# and the project itself (a few megabytes). A code change rebuilds only the second.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# Extra `pip install` flags for both layers: the buildah script installs from a local wheelhouse
# with `--no-index --find-links /wheels` (machines with no route to the index, or a TLS proxy
# whose CA the base image lacks); empty means the package index, as usual.
ARG PIP_INSTALL_FLAGS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN (getent group 1000 || groupadd --gid 1000 impala) \
 && (getent passwd 1000 || useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin impala)

WORKDIR /src
# Only the lock (requirements/runtime.lock: every package and its hashes, the versions the tests
# ran with), so this layer is reused until it changes. Bytecode is compiled here: at run time the
# root filesystem is read-only, and importing torch from source alone would cost seconds in every
# pod.
COPY requirements/runtime.lock ./requirements/
RUN python3 -m venv /opt/impalajob \
 && /opt/impalajob/bin/pip install ${PIP_INSTALL_FLAGS} --require-hashes --no-deps \
        -r requirements/runtime.lock

COPY pyproject.toml ./
COPY README.md ./
COPY api ./api
COPY trainer ./trainer
COPY operator ./operator
COPY cli ./cli
RUN /opt/impalajob/bin/pip install ${PIP_INSTALL_FLAGS} --no-deps . \
 && rm -rf /src/build /src/*.egg-info

# HOME is /tmp: pods run with a read-only root filesystem and an emptyDir on /tmp, where Ray's
# session directory and torch/gymnasium caches go.
ENV PATH=/opt/impalajob/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RAY_USAGE_STATS_ENABLED=0
# Numeric, so `runAsNonRoot: true` can verify it without resolving a user name.
USER 1000:1000
WORKDIR /tmp
# Ray GCS, raylet, object manager; status sidecar; operator metrics and health.
EXPOSE 6379 6380 6381 8080 9090 8081
ENTRYPOINT ["impalajob"]
CMD ["--help"]
