"""pulsar-spark's option names on the ``topic`` source (also registered as ``pulsar``): a job written for
StreamNative's pulsar-spark connector runs unmodified where its options can be honoured.

    spark.readStream.format("pulsar")
        .option("service.url", "pulsar://broker:6650")   # checked for its form, used for nothing else
        .option("admin.url", "http://broker:8080")       # without zk: the metadata store the broker names
        .option("topic", "persistent://public/default/events")
        .option("predefinedSubscription", "etl")         # = subscriptionName
        .option("pulsar.client.authPluginClassName", "org.apache.pulsar.client.impl.auth.AuthenticationToken")
        .option("pulsar.client.authParams", "token:eyJ...")  # the bookies' token (= authTokenFile's)

The source reads the topics' ledgers from the bookies, not through a broker: ``service.url`` is not needed and not
used; ``admin.url`` is asked once per planning for ``GET /admin/v2/brokers/internal-configuration`` (Pulsar's
InternalConfigurationData, a superuser's call) when no ``zk`` is given, and its ``metadataStoreUrl`` and
``ledgersRootPath`` become ``zk`` and ``zkRoot``. Options pulsar-spark hands to its Pulsar client, reader or admin
client (``pulsar.client.*``, ``pulsar.reader.*``, ``pulsar.admin.*``, ``pulsar.producer.*``) and ``pollTimeoutMs`` /
``allowDifferentTopicSchemas`` have nothing to act on here: accepted, and one warning names them. pulsar-spark
options that change what a query reads but cannot be honoured are refused naming the option
(:data:`REFUSED_OPTIONS`), as is every other unknown option (:mod:`spark._topic_options`).
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from spark._topic_options import TopicOptionError, TopicOptions, parse_topic_options

__all__ = [
    "IGNORED_PREFIXES",
    "REFUSED_OPTIONS",
    "TOKEN_PLUGIN",
    "PulsarOptions",
    "parse_source_options",
    "split_pulsar_options",
]

log = logging.getLogger(__name__)

#: The one authentication plugin whose credentials the bookies check (the same tokens as the brokers').
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
#: Prefixes of the options pulsar-spark passes to its Pulsar client, reader, admin client and producer.
IGNORED_PREFIXES = ("pulsar.client.", "pulsar.reader.", "pulsar.admin.", "pulsar.producer.")
#: pulsar-spark options accepted (checked for form) with nothing to act on here.
IGNORED_OPTIONS = ("pollTimeoutMs", "allowDifferentTopicSchemas")
#: pulsar-spark options this source cannot honour, and why.
REFUSED_OPTIONS = {
    "subscriptionprefix": (
        "subscriptionPrefix",
        "not supported: a query's own subscription is named spark-topic-…; name one with "
        "predefinedSubscription (or subscriptionName)",
    ),
    "topic.schema.class": (
        "topic.schema.class",
        "not supported: the source gives each message's payload as bytes (value) and has no sink",
    ),
}
#: The admin call's timeout (planning waits for it).
ADMIN_TIMEOUT_S = 10.0

_SERVICE_URL = re.compile(r"(pulsar(\+ssl)?|https?)://[^/\s,:]+(:\d{1,5})?(,[^/\s,:]+(:\d{1,5})?)*/?")
_ADMIN_URL = re.compile(r"https?://[^/\s,:]+(:\d{1,5})?/?")
_warned: set[tuple[str, ...]] = set()


@dataclass(frozen=True, slots=True)
class PulsarOptions:
    """What pulsar-spark's options say, beside the source's own options they map to (:attr:`native`)."""

    native: dict[str, str]  # the options for parse_topic_options, pulsar-spark's names replaced
    admin_url: str | None  # asked for the metadata store when no zk is given
    token: str | None  # pulsar.client.authParams' token: the bookies' token, and the admin call's
    admin_token: str | None  # pulsar.admin.authParams' token (the admin call's, before ``token``)
    ignored: tuple[str, ...]  # accepted, nothing done with them (as given)


def _token(opts: Mapping[str, str], prefix: str) -> str | None:
    """The token of ``<prefix>authPluginClassName`` (AuthenticationToken's) and ``<prefix>authParams``
    (``token:…``, ``file:…``, ``{"token": …}``, ``{"file": …}`` or the token itself, as AuthenticationToken
    reads them); None when neither is given."""
    plugin_opt, params_opt = prefix + "authPluginClassName", prefix + "authParams"
    plugin = opts.get(plugin_opt.lower())
    params = opts.get(params_opt.lower())
    if plugin is None and params is None:
        return None
    if plugin is None or str(plugin).strip() != TOKEN_PLUGIN:
        raise TopicOptionError(
            plugin_opt,
            f"only token authentication ({TOKEN_PLUGIN}) is supported: the bookies check the same tokens as the "
            f"brokers, and nothing else; got {plugin!r}",
        )
    text = str(params or "").strip()
    if text.startswith("{"):
        try:
            d = json.loads(text)
        except ValueError:
            d = None
        if not isinstance(d, dict) or not ({"token", "file"} & set(d)):
            raise TopicOptionError(params_opt, 'the JSON form is {"token": "…"} or {"file": "…"}')
        text = f"token:{d['token']}" if "token" in d else f"file:{d['file']}"
    if text.startswith("file:"):
        path = re.sub(r"^file:(//)?", "", text)
        try:
            text = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise TopicOptionError(params_opt, f"cannot read the token file {path}: {e}") from None
    elif text.startswith("token:"):
        text = text[len("token:") :].strip()
    if not text or len(text.split()) != 1:
        raise TopicOptionError(params_opt, 'expected one token: token:<token>, file:<path> or {"token": …}')
    return text


def split_pulsar_options(options: Mapping[str, str]) -> PulsarOptions:
    """Take pulsar-spark's options out of ``options`` (pure but for a ``file:`` token): check each, map those
    with a counterpart, refuse those that cannot be honoured (:class:`TopicOptionError` naming the option)."""
    opts = {str(k).lower(): v for k, v in options.items()}
    for key, (name, why) in REFUSED_OPTIONS.items():
        if key in opts:
            raise TopicOptionError(name, why)
    native = {
        k: v
        for k, v in options.items()
        if not str(k).lower().startswith(IGNORED_PREFIXES)
        and str(k).lower()
        not in ("service.url", "admin.url", "predefinedsubscription", *(o.lower() for o in IGNORED_OPTIONS))
    }
    service = opts.get("service.url")
    if service is not None and not _SERVICE_URL.fullmatch(str(service).strip()):
        raise TopicOptionError(
            "service.url", f"expected pulsar://HOST:PORT (or pulsar+ssl://, http[s]://), got {service!r}"
        )
    admin = opts.get("admin.url")
    if admin is not None and not _ADMIN_URL.fullmatch(str(admin).strip()):
        raise TopicOptionError("admin.url", f"expected http[s]://HOST:PORT, got {admin!r}")
    sub = opts.get("predefinedsubscription")
    if sub is not None:
        if "subscriptionname" in opts:
            raise TopicOptionError(
                "predefinedSubscription", "give either predefinedSubscription or subscriptionName, not both"
            )
        native["subscriptionName"] = sub
    if "polltimeoutms" in opts:
        try:
            if int(str(opts["polltimeoutms"]).strip()) < 0:
                raise ValueError
        except ValueError:
            raise TopicOptionError(
                "pollTimeoutMs", f"expected a non-negative integer, got {opts['polltimeoutms']!r}"
            ) from None
    if "allowdifferenttopicschemas" in opts and str(
        opts["allowdifferenttopicschemas"]
    ).strip().lower() not in ("true", "false"):
        raise TopicOptionError(
            "allowDifferentTopicSchemas",
            f"expected true or false, got {opts['allowdifferenttopicschemas']!r}",
        )
    token = _token(opts, "pulsar.client.")
    if token is not None and "authtokenfile" in opts:
        raise TopicOptionError(
            "pulsar.client.authParams", "give either pulsar.client.authParams or authTokenFile, not both"
        )
    handled = {
        f"pulsar.{side}.{o}".lower()
        for side in ("client", "admin")
        for o in ("authPluginClassName", "authParams")
    }
    ignored = tuple(
        sorted(
            str(k)
            for k in options
            if str(k).lower() not in handled
            and (
                str(k).lower().startswith(IGNORED_PREFIXES)
                or str(k).lower() in {o.lower() for o in IGNORED_OPTIONS}
            )
        )
    )
    return PulsarOptions(
        native=native,
        admin_url=None if admin is None else str(admin).strip().rstrip("/"),
        token=token,
        admin_token=_token(opts, "pulsar.admin."),
        ignored=ignored,
    )


def internal_configuration(admin_url: str, token: str | None) -> tuple[str, str]:
    """(zk, zkRoot) from the broker's ``GET /admin/v2/brokers/internal-configuration``: ``metadataStoreUrl``
    (``zk:HOST:PORT[,…]``) and ``ledgersRootPath`` (``<zkRoot>/ledgers``). Errors name ``admin.url``."""
    url = admin_url + "/admin/v2/brokers/internal-configuration"
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=ADMIN_TIMEOUT_S) as r:  # noqa: S310 - http(s) checked above
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        reason = e.read().decode("utf-8", "replace")[:300]
        hint = ""
        if e.code in (401, 403):
            hint = (
                "; the broker answers it to a superuser only: give a superuser's token "
                "(pulsar.client.authParams or pulsar.admin.authParams), or give zk instead"
            )
        raise TopicOptionError("admin.url", f"GET {url} answered {e.code} {reason}{hint}") from None
    except (OSError, ValueError) as e:
        raise TopicOptionError("admin.url", f"GET {url} failed: {e}; or give zk instead") from None
    store = str(body.get("metadataStoreUrl") or "") if isinstance(body, dict) else ""
    root = str(body.get("ledgersRootPath") or "") if isinstance(body, dict) else ""
    zk = store[len("zk:") :] if store.startswith("zk:") else store
    if not zk or "://" in zk or "/" in zk or not root.endswith("/ledgers"):
        raise TopicOptionError(
            "admin.url",
            f"{url} names a metadata store this source cannot read (metadataStoreUrl {store!r}, "
            f"ledgersRootPath {root!r}); give zk and zkRoot instead",
        )
    return zk, root[: -len("/ledgers")] or "/"


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> TopicOptions:
    """The ``topic`` / ``pulsar`` source's options, pulsar-spark's names among them: :func:`split_pulsar_options`,
    the metadata store from ``admin.url`` when no ``zk`` is given, then :func:`parse_topic_options`."""
    p = split_pulsar_options(options)
    native = dict(p.native)
    lowered = {str(k).lower() for k in native}
    if p.admin_url is not None and "zk" not in lowered:
        native["zk"], root = internal_configuration(p.admin_url, p.admin_token or p.token)
        if "zkroot" not in lowered:
            native["zkRoot"] = root
    opts = parse_topic_options(native, streaming=streaming)
    if p.ignored and p.ignored not in _warned:
        _warned.add(p.ignored)
        log.warning(
            "pulsar-spark options with no effect here (the source reads the bookies, not through a Pulsar "
            "client): %s",
            ", ".join(p.ignored),
        )
    return opts if p.token is None else replace(opts, auth_token=p.token)
