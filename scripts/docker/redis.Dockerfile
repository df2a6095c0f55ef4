# A stand-in for the official Redis image on machines that reach no registry:
# Debian's redis-server on the local base image, same data dir (/data) and user.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server=5:7.0.* \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD ["redis-cli", "ping"]
CMD ["redis-server", "--dir", "/data"]
