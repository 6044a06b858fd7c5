"""``ledgerstore auth``: the token secret and tokens (docs/operations.md, "Authentication").

    ledgerstore auth create-secret FILE                      32 random bytes, mode 600 (refuses to overwrite)
    ledgerstore auth create-token --subject NAME --secret-file FILE [--expiry 30d]

Tokens are HS256 JWTs (``bookie.auth``): the same string works as a Pulsar client's ``AuthenticationToken``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bookie import auth
from bookie.main import load_secret

from .cli import CommandError, emit


def add_auth_command(sub: Any) -> None:
    ap = sub.add_parser("auth", help="the token secret and tokens (bookies' and brokers' authentication)")
    verbs = ap.add_subparsers(dest="action", required=True)
    secret = verbs.add_parser("create-secret", help="write a new secret key file (mode 600)")
    secret.add_argument("file", type=Path, help="where to write the key (refuses to overwrite)")
    secret.add_argument("--json", action="store_true", help="machine-readable output")
    token = verbs.add_parser("create-token", help="print a token signed with the secret key")
    token.add_argument("--subject", required=True, help="the principal the token speaks for")
    token.add_argument("--secret-file", type=Path, required=True, help="the key from create-secret")
    token.add_argument(
        "--expiry", default=None, help="validity: 30d, 12h, 90m, 3600 (seconds), 1y; default: never expires"
    )
    token.add_argument("--json", action="store_true", help="machine-readable output")
    ap.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "create-secret":
        path: Path = args.file
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise CommandError(
                f"{path} exists; a new secret would invalidate every token signed with it"
            ) from None
        with os.fdopen(fd, "wb") as f:
            f.write(auth.new_secret())
        emit(
            args,
            f"secret key written to {path} (mode 600); pass it as --auth-secret-file",
            {"file": str(path)},
        )
        return 0
    try:
        secret = load_secret(args.secret_file)
        expires_in_s = auth.parse_duration_s(args.expiry) if args.expiry else None
        token = auth.create_token(secret, args.subject, expires_in_s=expires_in_s)
    except (OSError, ValueError) as e:
        raise CommandError(str(e)) from None
    emit(args, token, {"token": token, "subject": args.subject, "expires_in_s": expires_in_s})
    return 0
