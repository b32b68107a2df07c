# One image for both processes: `bot` (the default) or `workers`, chosen by the command:
#   docker run ... IMAGE            -> python -m bot
#   docker run ... IMAGE workers    -> python -m workers
#   docker run ... IMAGE workers status
# Slim, non-root, with bubblewrap for the walls around stdio MCP servers (docs/deploying.md).

ARG PYTHON=3.12

FROM python:${PYTHON}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY harness harness
COPY messages messages
COPY store store
COPY observe observe
COPY runtime runtime
COPY gates gates
COPY ops ops
COPY workers workers
COPY bot bot
COPY playground playground
COPY launch launch
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:${PYTHON}-slim
# bubblewrap: every stdio MCP server runs inside its walls, and none starts without them.
# tini: signals reach the process as sent (SIGTERM drains a worker, SIGHUP reloads the config).
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap tini \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/harness harness \
    && mkdir /workspace && chown harness:harness /workspace
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER harness
WORKDIR /home/harness
ENV PYTHONUNBUFFERED=1 \
    HARNESS_WORKSPACE=/workspace \
    HARNESS_STATE_DIR=/home/harness/state \
    PORT=3000
EXPOSE 3000
ENTRYPOINT ["tini", "--", "python", "-m"]
CMD ["bot"]
