# Apache ZooKeeper from Debian's `zookeeper` package: one standalone server for ledgerstore.
#
# Build (context: docker/zookeeper, which holds zoo.cfg):
#   docker build -f docker/zookeeper.Dockerfile -t ledgerstore/zookeeper:dev docker/zookeeper
#   docker build --build-arg BASE_IMAGE=ledgerstore/base:bookworm ...   # the offline base (docker/build-offline.sh)
# Run:
#   docker run -d -p 127.0.0.1:2181:2181 ledgerstore/zookeeper:dev
#   printf srvr | nc 127.0.0.1 2181          # -> "Mode: standalone"
#
# The official `zookeeper` image works as well (docker/compose.yaml defaults to it); this one exists because it
# builds from Debian packages only, with no image registry.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# The JRE comes in as a dependency of the package. No recommends: no GUI, no docs.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends zookeeper; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log; \
    # The package creates a system user `zookeeper`; make sure it exists even if that ever changes.
    id zookeeper >/dev/null 2>&1 || useradd --system --home-dir /data --shell /usr/sbin/nologin zookeeper; \
    mkdir -p /conf /data /datalog; \
    chown zookeeper:zookeeper /data /datalog; \
    # Fail the build now if the class path below stops working (e.g. a package reorganisation).
    java -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
        org.apache.zookeeper.version.VersionInfoMain

COPY zoo.cfg /conf/zoo.cfg

# zookeeper.jar's manifest carries the Class-Path of its Debian dependencies (jute, netty, jackson, jetty, ...);
# slf4j-simple is the logging binding (log lines to stderr, no log4j configuration needed).
ENV ZK_CLASSPATH=/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
    ZK_JAVA_OPTS="-Xms64m -Xmx512m -XX:+ExitOnOutOfMemoryError -Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ"

USER zookeeper
WORKDIR /data
VOLUME ["/data", "/datalog"]
EXPOSE 2181

# Healthy = the server answers the `srvr` four-letter word as a standalone server. bash's /dev/tcp: no nc needed.
HEALTHCHECK --interval=5s --timeout=4s --start-period=30s --retries=6 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/2181 && printf srvr >&3 && timeout 3 cat <&3 | grep -q 'Mode: standalone'"]

# OCI annotations (last: changing them rebuilds nothing). The ZooKeeper version is Debian bookworm's package.
ARG VERSION=unspecified REVISION="" CREATED="" SOURCE=""
LABEL org.opencontainers.image.title="ledgerstore-zookeeper" \
      org.opencontainers.image.description="Apache ZooKeeper from Debian's package, standalone, as ledgerstore's metadata store" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="ledgerstore" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}"

ENTRYPOINT ["/bin/sh", "-c", "exec java $ZK_JAVA_OPTS -cp \"$ZK_CLASSPATH\" org.apache.zookeeper.server.quorum.QuorumPeerMain \"$@\"", "zookeeper"]
CMD ["/conf/zoo.cfg"]
