#!/usr/bin/env bash
# Build ledgerstore's container images without any image registry (what `make docker-images` runs).
#
#   1. make sure a Docker engine runs                     (scripts/docker-engine.sh)
#   2. a Debian base image from debootstrap                -> ledgerstore/base:bookworm   (cached: skipped if present)
#   3. wheels of the project's dependencies, built on the host -> docker/wheelhouse/      (cached by a stamp)
#   4. the images, FROM that base, installing from the wheelhouse with --no-index
#                                                          -> ledgerstore/ledgerstore:dev, ledgerstore/zookeeper:dev
#
# The Dockerfiles work without this script too (default base: the official Python image, pip from the index);
# this script only swaps the base and feeds pip local wheels. Re-running it is cheap: every step is cached.
#
# Environment:
#   TAG=dev                  tag of the two images
#   BASE_IMAGE=ledgerstore/base:bookworm   base image to build (if missing) and build on
#   DEBIAN_SUITE=bookworm    suite for debootstrap
#   DEBIAN_MIRROR=           mirror for debootstrap (default: read from this machine's apt sources)
#   PYTHON=.venv/bin/python  the host Python that builds wheels (must be the image's minor version: 3.11)
#   REBUILD_BASE=1           rebuild the base even if it exists
#   REBUILD_WHEELS=1         rebuild the wheelhouse even if its stamp matches
#   NO_CACHE=1               pass --no-cache to docker build
#   ONLY=ledgerstore|zookeeper   build one image only
#   VERSION, SOURCE_URL      OCI labels version/source (default: setup.cfg's version, `git remote get-url origin`)
#   STRICT_SMOKE=0           only warn when the smoke test of the ledgerstore image fails
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TAG="${TAG:-dev}"
BASE_IMAGE="${BASE_IMAGE:-ledgerstore/base:bookworm}"
DEBIAN_SUITE="${DEBIAN_SUITE:-bookworm}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WHEELHOUSE="$ROOT/docker/wheelhouse"
APP_IMAGE="ledgerstore/ledgerstore:$TAG"
ZK_IMAGE="ledgerstore/zookeeper:$TAG"
# Debian's client: it builds with BuildKit (DOCKER_BUILDKIT=1) without a buildx plugin; another client that may
# come first on PATH does not. BuildKit is needed for docker/Dockerfile.dockerignore.
if [ -z "${DOCKER:-}" ]; then
    if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER="$(command -v docker)"; fi
fi
export DOCKER DOCKER_BUILDKIT=1

T0=$SECONDS
log() { printf '[build-offline %4ss] %s\n' "$((SECONDS - T0))" "$*" >&2; }
timed() {  # timed NAME CMD... : run CMD, report how long it took
    local name="$1" t=$SECONDS
    shift
    "$@"
    log "$name: $((SECONDS - t))s"
}

# --- 1. engine -----------------------------------------------------------------------------------------------
timed engine bash "$ROOT/scripts/docker-engine.sh" >/dev/null

# --- 2. base image -------------------------------------------------------------------------------------------
detect_mirror() {
    # The first apt source of type `deb` for $DEBIAN_SUITE on this machine, deb822 (*.sources) or one-line
    # (*.list) format. Never hard-coded: whatever mirror this machine's apt uses.
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v suite="$DEBIAN_SUITE" 'BEGIN { RS = "" } {
            uris = ""; suites = ""; types = ""; enabled = 1
            n = split($0, L, "\n")
            for (i = 1; i <= n; i++) {
                if (L[i] ~ /^URIs:/)    { sub(/^URIs:[ \t]*/, "", L[i]);   uris = L[i] }
                if (L[i] ~ /^Suites:/)  { sub(/^Suites:[ \t]*/, "", L[i]); suites = " " L[i] " " }
                if (L[i] ~ /^Types:/)   { types = L[i] " " }
                if (L[i] ~ /^Enabled:[ \t]*no/) enabled = 0
            }
            if (enabled && types ~ /[ :]deb / && index(suites, " " suite " ")) { split(uris, U, " "); print U[1]; exit }
        }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [options] URI SUITE COMPONENTS...
        sed -e 's/\[[^]]*\]//' "$f" | awk -v suite="$DEBIAN_SUITE" '$1 == "deb" && $3 == suite { print $2; exit }'
    done
}

build_base() {
    command -v debootstrap >/dev/null 2>&1 || {
        log "installing debootstrap (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    local mirror="${DEBIAN_MIRROR:-}"
    [ -n "$mirror" ] || mirror="$(detect_mirror | head -n 1)"
    if [ -z "$mirror" ]; then
        log "no apt source for suite $DEBIAN_SUITE found in /etc/apt; set DEBIAN_MIRROR"
        exit 1
    fi
    local dir
    dir="$(mktemp -d /var/tmp/ledgerstore-base.XXXXXX)"
    # shellcheck disable=SC2064
    trap "rm -rf '$dir'" EXIT
    log "debootstrap --variant=minbase $DEBIAN_SUITE (mirror from this machine's apt sources)"
    debootstrap --variant=minbase --include=ca-certificates "$DEBIAN_SUITE" "$dir" "$mirror" \
        >"$dir.log" 2>&1 || { tail -n 30 "$dir.log" >&2; exit 1; }
    rm -f "$dir.log"
    # Slim it down like a container base: no package caches or lists (every Dockerfile runs apt-get update).
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/cache/apt/*.bin "$dir"/var/lib/apt/lists/* \
        "$dir"/var/log/* "$dir"/tmp/* "$dir"/dev/*
    mkdir -p "$dir/dev"
    printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
        >"$dir/etc/apt/apt.conf.d/90ledgerstore-no-recommends"
    tar --numeric-owner -C "$dir" -c . | "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        --message "debootstrap --variant=minbase $DEBIAN_SUITE" \
        - "$BASE_IMAGE" >/dev/null
    rm -rf "$dir"
    trap - EXIT
}

if [ "${REBUILD_BASE:-0}" != 1 ] && "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "base: $BASE_IMAGE exists (REBUILD_BASE=1 to rebuild)"
else
    timed "base $BASE_IMAGE" build_base
fi

# --- 3. wheelhouse -------------------------------------------------------------------------------------------
project_requirements() {
    # What the image's `pip install .[fast]` needs, read from the project's metadata without building it:
    # install_requires, the `fast` extra, and the build backend (pyproject's build-system.requires).
    "$PYTHON" - "$ROOT" <<'PY'
import configparser, pathlib, sys, tomllib
root = pathlib.Path(sys.argv[1])
cfg = configparser.ConfigParser()
cfg.read(root / "setup.cfg")
lines = cfg.get("options", "install_requires", fallback="").splitlines()
lines += cfg.get("options.extras_require", "fast", fallback="").splitlines()
lines += tomllib.loads((root / "pyproject.toml").read_text())["build-system"]["requires"]
print("\n".join(sorted({line.strip() for line in lines if line.strip()})))
PY
}

build_wheels() {
    local stamp="$1" reqs
    reqs="$(mktemp)"
    project_requirements >"$reqs"
    rm -rf "$WHEELHOUSE"/*.whl "$WHEELHOUSE"/.stamp
    # (the filter drops pip's warnings about find-links locations of this machine's pip configuration that do
    # not exist)
    if ! "$PYTHON" -m pip wheel --quiet --disable-pip-version-check -w "$WHEELHOUSE" -r "$reqs" 2>&1 |
        { grep -v -e "is ignored: it is neither a file nor a directory" >&2 || true; }; then
        log "pip wheel failed"
        exit 1
    fi
    rm -f "$reqs"
    printf '%s\n' "$stamp" >"$WHEELHOUSE/.stamp"
}

if [ "${ONLY:-}" != zookeeper ]; then
    py_tag="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    if [ "$py_tag" != cp311 ]; then
        log "warning: $PYTHON is $py_tag; the image's Python is 3.11, compiled wheels may not match"
    fi
    stamp="$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16) $py_tag"
    if [ "${REBUILD_WHEELS:-0}" != 1 ] && [ "$(cat "$WHEELHOUSE/.stamp" 2>/dev/null)" = "$stamp" ] &&
        compgen -G "$WHEELHOUSE/*.whl" >/dev/null; then
        log "wheelhouse: up to date ($(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels)"
    else
        timed wheelhouse build_wheels "$stamp"
        log "wheelhouse: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1)"
    fi
fi

# --- 4. images -----------------------------------------------------------------------------------------------
# OCI labels: the package's version, the commit and its date (not the build time: a rebuild of the same commit
# yields the same labels, so nothing is rebuilt for them), the git remote when there is one.
project_version() {
    "$PYTHON" - "$ROOT" <<'PY'
import configparser, pathlib, sys
cfg = configparser.ConfigParser()
cfg.read(pathlib.Path(sys.argv[1]) / "setup.cfg")
print(cfg.get("metadata", "version", fallback="unspecified"))
PY
}
label_args=(--build-arg "VERSION=${VERSION:-$(project_version)}")
if git -C "$ROOT" rev-parse --verify -q HEAD >/dev/null 2>&1; then
    label_args+=(--build-arg "REVISION=$(git -C "$ROOT" rev-parse HEAD)"
        --build-arg "CREATED=$(git -C "$ROOT" log -1 --format=%cI HEAD)")
fi
source_url="${SOURCE_URL:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)}"
[ -n "$source_url" ] && label_args+=(--build-arg "SOURCE=$source_url")
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" "${label_args[@]}")
[ "${NO_CACHE:-0}" = 1 ] && build_args+=(--no-cache)
quiet=(--quiet)
[ "${VERBOSE:-0}" = 1 ] && quiet=()

if [ "${ONLY:-}" != zookeeper ]; then
    timed "image $APP_IMAGE" "$DOCKER" build "${quiet[@]}" "${build_args[@]}" \
        -f docker/Dockerfile -t "$APP_IMAGE" . >/dev/null
fi
if [ "${ONLY:-}" != ledgerstore ]; then
    timed "image $ZK_IMAGE" "$DOCKER" build "${quiet[@]}" "${build_args[@]}" \
        -f docker/zookeeper.Dockerfile -t "$ZK_IMAGE" docker/zookeeper >/dev/null
fi

if [ "${ONLY:-}" != zookeeper ]; then
    # Smoke test: the console script runs, every server's command is there, the packages import (spark's
    # modules are present; pyspark itself is not in the image, it comes with the `spark` extra where Spark runs).
    smoke() {
        "$DOCKER" run --rm "$APP_IMAGE" --help >/dev/null &&
            "$DOCKER" run --rm "$APP_IMAGE" broker serve --help >/dev/null &&
            "$DOCKER" run --rm "$APP_IMAGE" autorecovery serve --help >/dev/null &&
            "$DOCKER" run --rm --entrypoint /opt/ledgerstore/bin/python "$APP_IMAGE" -c '
import importlib, importlib.util
for m in ("bookie.main", "ledger_client.sync", "zk", "topic_broker.main", "topic_broker.pulsar_api_pb2",
          "autorecovery.service", "spark", "ledgerstore.cli"):
    importlib.import_module(m)
for m in ("spark.ledger_source", "spark.topic_source", "pyspark_ledgerstore_ledger", "pyspark_ledgerstore_topic"):
    assert importlib.util.find_spec(m) is not None, m
assert importlib.util.find_spec("pulsar") is None, "pulsar-client is not a runtime dependency"
'
    }
    if out="$(smoke 2>&1)"; then
        log "smoke: --help, broker serve --help, autorecovery serve --help, imports: ok"
    else
        log "smoke: FAILED in $APP_IMAGE: $(printf '%s' "$out" | tail -n 5)"
        [ "${STRICT_SMOKE:-1}" = 1 ] && exit 1
    fi
fi

"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}\t{{.Size}}\t{{.CreatedSince}}' |
    grep -E "^(${BASE_IMAGE%%:*}|ledgerstore/)" | sort -u >&2 || true
log "done in $((SECONDS - T0))s"
