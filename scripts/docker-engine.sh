#!/usr/bin/env bash
# Make sure a Docker engine is running on this machine, then print its status.
#
# Idempotent: installs Debian's Docker engine package when dockerd is missing, starts dockerd in the background when
# `docker info` does not answer, and waits (bounded) until it does. Safe to run again at any time.
#
# Environment:
#   DOCKER                 client to use (default: /usr/bin/docker when present, else `docker` on PATH)
#   DOCKERD_LOG            dockerd's log file (default: /var/log/ledgerstore-dockerd.log)
#   DOCKERD_WAIT_S         how long to wait for the engine to answer (default: 60)
#   DOCKER_ENGINE_NO_INSTALL=1   never install packages, fail instead
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/ledgerstore-dockerd.log}"
DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"

log() { printf '[docker-engine] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        log "need root for: $*"
        return 1
    fi
}

pick_client() {
    if [ -n "${DOCKER:-}" ]; then
        printf '%s' "$DOCKER"
    elif [ -x /usr/bin/docker ]; then
        # Debian's client: supports DOCKER_BUILDKIT=1 without a buildx plugin. Another client may come first
        # on PATH (e.g. /usr/local/bin/docker) without buildx; we avoid it on purpose.
        printf '%s' /usr/bin/docker
    else
        command -v docker || true
    fi
}

engine_answers() { "$DOCKER" info >/dev/null 2>&1; }

# drop_stale_pidfile FILE NAME: remove FILE when the pid it holds is not a running process called NAME.
drop_stale_pidfile() {
    local file="$1" name="$2" pid comm
    [ -f "$file" ] || return 0
    pid="$(tr -dc 0-9 <"$file" 2>/dev/null || true)"
    comm="$( [ -n "$pid" ] && cat "/proc/$pid/comm" 2>/dev/null || true)"
    if [ "$comm" != "$name" ]; then
        log "removing stale $file (pid ${pid:-none} is ${comm:-not running}, not $name)"
        as_root rm -f "$file"
    fi
}

# 1. Install the engine when it is missing.
if ! command -v dockerd >/dev/null 2>&1 || [ -z "$(pick_client)" ]; then
    if [ "${DOCKER_ENGINE_NO_INSTALL:-0}" = 1 ]; then
        log "dockerd is not installed and DOCKER_ENGINE_NO_INSTALL=1"
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    # Debian's engine package (dockerd, containerd, runc, the client, tini); looked up by pattern.
    pkg="$(apt-cache pkgnames docker | grep -x 'docker[.]io' | head -n 1)"
    [ -n "$pkg" ] || { log "no Docker engine package in the apt sources"; exit 1; }
    log "installing $pkg (apt)"
    as_root apt-get install -y -qq "$pkg" >/dev/null
fi
# Compose for `make docker-up` / `ledgerstore cluster up --docker` (best effort: the tests do not need it).
if ! command -v docker-compose >/dev/null 2>&1 && ! /usr/bin/docker compose version >/dev/null 2>&1 \
        && [ "${DOCKER_ENGINE_NO_INSTALL:-0}" != 1 ]; then
    log "installing docker-compose (apt)"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker-compose >/dev/null 2>&1 \
        || log "could not install docker-compose (only needed for compose deployments)"
fi
DOCKER="$(pick_client)"
if [ -z "$DOCKER" ]; then
    log "no docker client found after installation"
    exit 1
fi

# 2. Start dockerd when nothing answers.
if engine_answers; then
    log "engine already running"
else
    if pgrep -x dockerd >/dev/null 2>&1; then
        log "dockerd process exists but does not answer yet; waiting"
    else
        # A dockerd killed without its clean-up leaves pid files behind; once that pid is reused by another
        # process, a new dockerd takes it for its containerd "still running", waits for a socket nobody serves
        # and gives up ("timeout waiting for containerd to start"). Drop pid files naming no such daemon.
        drop_stale_pidfile /var/run/docker/containerd/containerd.pid containerd
        drop_stale_pidfile /var/run/docker.pid dockerd
        log "starting dockerd (log: $DOCKERD_LOG)"
        as_root mkdir -p "$(dirname "$DOCKERD_LOG")"
        # setsid + nohup: the daemon outlives this shell and the CI step that ran it.
        as_root setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    deadline=$((SECONDS + DOCKERD_WAIT_S))
    until engine_answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "engine did not answer within ${DOCKERD_WAIT_S}s; last lines of $DOCKERD_LOG:"
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    log "engine up after $((SECONDS))s"
fi

# 3. Status.
"$DOCKER" info --format \
    'engine: server {{.ServerVersion}}, storage {{.Driver}}, cgroup {{.CgroupDriver}} v{{.CgroupVersion}}, {{.Images}} images, {{.ContainersRunning}} running containers'
printf 'client: %s (%s)\n' "$DOCKER" "$("$DOCKER" version --format '{{.Client.Version}}' 2>/dev/null || echo '?')"
