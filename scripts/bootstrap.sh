#!/usr/bin/env bash
# Installs what ledgerstore needs on a fresh Debian machine: ZooKeeper (Debian's package) when absent, and a
# virtualenv in .venv with the project and its dev extras. Idempotent and quiet when nothing is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev,docker,spark,pulsar}

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp="$VENV/.installed-$(cat setup.cfg pyproject.toml | sha1sum | cut -c1-12)-$EXTRAS-compat"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  echo "bootstrap: installing Python packages into $VENV (extras: $EXTRAS)"
  "$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v -i "warning" || true
  # compat: a .pth puts the checkout on sys.path, so PySpark's scan of top-level `pyspark_*` modules finds our
  # data sources (an import-hook editable install hides them from pkgutil.iter_modules).
  "$VENV/bin/pip" install -q -e ".[$EXTRAS]" --config-settings editable_mode=compat 2>&1 | grep -v -i "warning: location" || true
  "$VENV/bin/python" -c "import kazoo, rocksdict, aiohttp, crc32c, prometheus_client"
  # the linters `make lint` runs (the dev extra)
  case ",$EXTRAS," in *,dev,*) "$VENV/bin/lint-imports" --help >/dev/null ;; esac
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
