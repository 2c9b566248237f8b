# syntax=docker/dockerfile:1
#
# tunefarm: the tracker, the device agent and the command line, in one Dockerfile.
#
#   docker build -t tunefarm .                                         # pip install .[all]: everything
#   docker build -t tunefarm-agent --build-arg TUNEFARM_EXTRAS= .      # base dependencies only (agent, tracker)
#
# Stage `build` makes the wheel. setup.py compiles rpc_tracker/proto/farm.proto with grpcio-tools
# during the build; pip installs grpcio-tools (and setuptools) into its isolated build environment
# from pyproject.toml's [build-system] requires, so it never reaches the runtime image. The
# generated *_pb2*.py files of a developer checkout are not copied in (.dockerignore): the image
# always carries modules generated from the .proto in the build context.
#
# The runtime stage installs that wheel with the extras in TUNEFARM_EXTRAS:
#   all (default)  the tuner's dependencies too (SQLAlchemy, Alembic, psycopg, XGBoost, rich):
#                  `tunefarm tune --tracker ...` with records in PostgreSQL, and the tracker
#   "" (empty)     numpy, llvmlite, grpcio, protobuf only: what a device agent needs (and all the
#                  tracker needs); the image for agents, also on small boards (arm64 builds the same)
#
# No token, password or other secret is baked in: TUNEFARM_AGENT_TOKEN / TUNEFARM_TUNER_TOKEN /
# TUNEFARM_DB_URL come from the environment at run time (see docker-compose.yml).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .


FROM ${PYTHON_IMAGE} AS runtime
ARG TUNEFARM_EXTRAS=all
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
# libgomp: the OpenMP runtime the compiler's kernels use for parallel loops (the JIT runtime
# loads it for every kernel, so the agent needs it too).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN set -eu; \
    wheel="$(ls /wheels/tunefarm-*.whl)"; \
    if [ -n "${TUNEFARM_EXTRAS}" ]; then wheel="${wheel}[${TUNEFARM_EXTRAS}]"; fi; \
    pip install "${wheel}"; \
    rm -rf /wheels; \
    tunefarm version
RUN useradd --system --create-home --uid 10001 --user-group tunefarm
USER tunefarm
WORKDIR /home/tunefarm
# 9190: the tracker's default port (agents and tuners dial it)
EXPOSE 9190
ENTRYPOINT ["tunefarm"]
CMD ["--help"]
