# The compose example's stand-in app (docker/compose.yaml): Debian slim with curl, run as a non-root user.
FROM debian:bookworm-slim
# Not pinned (hadolint DL3008): see docker/Dockerfile's runtime stage.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl ca-certificates \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*
USER 10002:10002
