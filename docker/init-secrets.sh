#!/bin/sh
# The compose deployment's credentials, made on first start (docker/compose.yaml's one-shot `init` service; the
# container tests run it the same way). Creates what is missing in $SECRETS_DIR (a named volume) and leaves what
# exists alone, so a restart or a second `up` keeps every secret and token:
#
#   token-secret        HS256 key (ledgerstore auth create-secret): bookies and the broker check tokens with it
#   zk-auth             ledgerstore:<random password>: ZooKeeper digest ACLs (LEDGERSTORE_ZK_AUTH_FILE), every service
#   broker.token        subject `broker`: the broker's ledgers on the bookies (bookie_auth_token_file)
#   autorecovery.token  subject `autorecovery`: AutoRecovery reading and copying ledgers
#   admin.token         subject `admin`: the `cli` profile and operators; a superuser on the broker (broker.toml)
#
# Tokens never expire; a new token-secret (delete the volume, or the file) makes new tokens. Runs as root to set
# ownership: every file belongs to the image's user (uid 10001, SERVICE_UID) with mode 600 in a 700 directory,
# since a bookie refuses a secret file readable by group or others. Needs the ledgerstore image (its CLI, Python).
#
# `init-secrets.sh cat-secret NAME` also prints one of them on stdout (after creating what is missing): how a host
# gets a client token and the ZooKeeper credentials out of the volume.
set -eu

dir="${SECRETS_DIR:-/etc/ledgerstore/secrets}"
uid="${SERVICE_UID:-10001}"
umask 077
mkdir -p "$dir"

made=""
if [ ! -s "$dir/token-secret" ]; then
    rm -f "$dir/token-secret" "$dir"/*.token
    ledgerstore auth create-secret "$dir/token-secret" >/dev/null
    made="$made token-secret"
fi
if [ ! -s "$dir/zk-auth" ]; then
    password="$(python -c 'import secrets; print(secrets.token_urlsafe(24))')"
    printf 'ledgerstore:%s\n' "$password" >"$dir/zk-auth.tmp"
    mv "$dir/zk-auth.tmp" "$dir/zk-auth"
    made="$made zk-auth"
fi
for subject in broker autorecovery admin; do
    if [ ! -s "$dir/$subject.token" ]; then
        ledgerstore auth create-token --subject "$subject" --secret-file "$dir/token-secret" >"$dir/$subject.token.tmp"
        mv "$dir/$subject.token.tmp" "$dir/$subject.token"
        made="$made $subject.token"
    fi
done

chown -R "$uid:$uid" "$dir"
chmod 700 "$dir"
chmod 600 "$dir"/*
echo "secrets in $dir: ${made:+created$made; }$(cd "$dir" && echo *)" >&2
if [ "${1:-}" = cat-secret ]; then
    case "${2:-}" in
        "" | */* | .*) echo "usage: init-secrets.sh cat-secret NAME (one of: $(cd "$dir" && echo *))" >&2; exit 2 ;;
    esac
    exec cat "$dir/$2"
fi
