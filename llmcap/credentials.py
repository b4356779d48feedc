"""Endpoint credentials: keep them out of everything a person or a tracker can read.

An endpoint URL may carry a password (`http://user:secret@host:8000`) or a token in its query
(`?api_key=...`). The URL itself is needed to talk to the server, but whatever we print, log, write
into a report or JSON, or send to MLflow goes through `redact_url` / `redact_text` first.

An API key never appears in params.yaml or on the command line (shell history, `ps`): it comes from
an environment variable and travels only in the `Authorization: Bearer` header, the way OpenAI
clients and `vllm serve --api-key` expect it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from llmcap.errors import LlmcapError

MASK = "***"
DEFAULT_API_KEY_ENV = "LLMCAP_API_KEY"
"""Read when no other variable is named; unset means the endpoint gets no Authorization header."""

# Query parameters whose values are credentials (compared case-insensitively, '-' as '_').
SECRET_QUERY_KEYS = frozenset(
    {
        "api_key",
        "apikey",
        "key",
        "token",
        "access_token",
        "auth",
        "auth_token",
        "password",
        "passwd",
        "pwd",
        "secret",
        "client_secret",
        "signature",
        "sig",
    }
)
# Header names whose values are credentials.
SECRET_HEADERS = frozenset({"authorization", "proxy_authorization", "x_api_key", "api_key", "cookie", "set_cookie"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Any scheme://userinfo@ in free text (error messages, YAML snippets).
_USERINFO_IN_TEXT = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/'\"]*)@")
_QUERY_IN_TEXT = re.compile(r"(?P<head>[?&;](?P<key>[A-Za-z_\-]+)=)(?P<value>[^&;#\s'\"]*)")


def _is_secret_key(key: str) -> bool:
    return key.lower().replace("-", "_") in SECRET_QUERY_KEYS


def _mask_userinfo(userinfo: str) -> str:
    # `user:password` keeps the user; a lone name may itself be a token (https://TOKEN@host), so it goes
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def redact_url(url: str) -> str:
    """The URL with its password and credential query values replaced by `***` (user and host kept).

    `http://user:secret@host:8000/v1?api_key=k&x=1` -> `http://user:***@host:8000/v1?api_key=***&x=1`;
    `https://TOKEN@host` -> `https://***@host`.
    A text that does not parse as a URL is scrubbed as free text instead.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{_mask_userinfo(userinfo)}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_is_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, MASK if _is_secret_key(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Free text (an error message, a YAML snippet) with every URL password and credential query value masked."""
    text = _USERINFO_IN_TEXT.sub(lambda m: f"{m['scheme']}{_mask_userinfo(m['userinfo'])}@", text)
    return _QUERY_IN_TEXT.sub(lambda m: m["head"] + (MASK if _is_secret_key(m["key"]) else m["value"]), text)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers fit to print: credential values masked."""
    return {k: MASK if k.lower().replace("-", "_") in SECRET_HEADERS else v for k, v in headers.items()}


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without `user:password@`, (user, password) or None).

    The client sends the pair as HTTP basic auth instead, so the URL it requests, logs (httpx logs
    every request URL at INFO) and hands on carries no secret.
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, (unquote(user), unquote(password))


def check_env_name(name: str) -> str:
    """`name` if it can be an environment variable's name; the error never echoes a value."""
    if not _ENV_NAME.fullmatch(name):
        raise LlmcapError(
            f"{name!r} is not an environment variable name (letters, digits, '_'): "
            "name the variable that holds the API key, never the key itself"
        )
    return name


def api_key_from_env(name: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key held by environment variable `name` (which must then be set and non-empty), or with
    no name the one in `LLMCAP_API_KEY` if set, else None (the endpoint needs no key)."""
    env = os.environ if environ is None else environ
    if name is None:
        return env.get(DEFAULT_API_KEY_ENV) or None
    check_env_name(name)
    value = env.get(name, "")
    if not value.strip():
        raise LlmcapError(f"environment variable {name} (named to hold the endpoint's API key) is not set or empty")
    return value.strip()
