"""API keys on the HTTP routes.

With any key configured (`--api-key`, repeatable; `--api-keys-file`; `DEEPRING_API_KEY`), every
route except /health needs one, sent as `Authorization: Bearer KEY` (OpenAI's clients) or
`x-api-key: KEY` (Anthropic's). A missing or unknown key is answered 401 in the route's own
error shape (OpenAI's error object, or Anthropic's `authentication_error` on /v1/messages) with
`WWW-Authenticate: Bearer`, before the route is even looked up: without a key nothing, not
even which routes exist, is revealed.

Keys are compared in constant time: the presented key and every configured key are hashed
(SHA-256, so lengths leak nothing either) and each pair is compared with hmac.compare_digest,
always over every configured key. Only the hashes are kept in memory after loading. A key is
never logged or echoed: logs and metrics name a key by `key_id`, a short prefix of its hash.

The keys file (one key per line; blank lines and `#` comments ignored) is re-read on SIGHUP; a
file that cannot be read or holds no key then keeps the keys in force (and says so in the log),
so a botched edit never turns authentication off.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import signal
import time
from pathlib import Path

from deepring.config import FrontendConfig, check_api_key
from deepring.frontend.http import HttpRequest
from deepring.frontend.metrics import Metrics
from deepring.protocol.errors import ApiError

log = logging.getLogger("deepring.frontend")

# Routes anyone may call: the load balancer's probe.
OPEN_ROUTES = frozenset({"/health"})
_LOG_EVERY = 10.0  # seconds between log lines about refused keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def key_id(key: str) -> str:
    """How logs and metrics name a key: `key-` and 8 hex digits of its SHA-256."""
    return "key-" + _digest(key).hex()[:8]


def read_keys_file(path: str | Path) -> list[str]:
    """The keys of a keys file. OSError when it cannot be read; ValueError (naming the line,
    never the key) for a line that is not a key, or when it holds none."""
    keys = []
    text = Path(path).read_text(encoding="utf-8")
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        check_api_key(line, f"{path} line {n}")
        keys.append(line)
    if not keys:
        raise ValueError(f"{path} holds no API key")
    return keys


def presented_keys(req: HttpRequest) -> list[str]:
    """The keys a request presents: `Authorization: Bearer KEY` and `x-api-key: KEY`."""
    out = []
    auth = req.headers.get("authorization", "")
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        out.append(token.strip())
    key = req.headers.get("x-api-key", "").strip()
    if key:
        out.append(key)
    return out


class ApiKeys:
    """The configured keys (as hashes), from the flags, the environment and the keys file."""

    def __init__(self, keys: tuple[str, ...] = (), keys_file: str | None = None) -> None:
        self._static = [(key_id(k), _digest(k)) for k in keys]
        self.keys_file = keys_file
        self._entries: list[tuple[str, bytes]] = []
        self.reload()

    def reload(self) -> int:
        """Read the keys file again; returns the number of keys in force. Raises (OSError,
        ValueError) and keeps the previous keys when the file is unusable."""
        entries = list(self._static)
        if self.keys_file is not None:
            entries += [(key_id(k), _digest(k)) for k in read_keys_file(self.keys_file)]
        self._entries = entries
        return len(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, presented: list[str]) -> str | None:
        """The id of the configured key among `presented`, or None. Every presented key is
        compared with every configured one, whatever matches first."""
        found = None
        for candidate in presented:
            digest = _digest(candidate)
            for kid, ref in self._entries:
                if hmac.compare_digest(digest, ref):
                    found = kid
        return found


class Authenticator:
    """The check every request passes before its route runs."""

    def __init__(self, config: FrontendConfig, metrics: Metrics) -> None:
        self.metrics = metrics
        self.keys: ApiKeys | None = None
        if config.auth_enabled:
            self.keys = ApiKeys(config.api_keys, config.api_keys_file)
        self._logged_at = float("-inf")
        self._unlogged = 0

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def check(self, req: HttpRequest, path: str) -> str | None:
        """The id of the request's key (None where no key is needed); ApiError 401 when a
        needed key is missing or wrong."""
        if self.keys is None or path in OPEN_ROUTES:
            return None
        presented = presented_keys(req)
        kid = self.keys.match(presented)
        if kid is not None:
            return kid
        self.metrics.auth_failures += 1
        if presented:
            message = "invalid API key"
            self._note(f"an invalid API key ({key_id(presented[0])}) on {req.method} {path}")
        else:
            message = "missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
            self._note(f"no API key on {req.method} {path}")
        raise ApiError(401, message, headers=[("www-authenticate", "Bearer")])

    def _note(self, what: str) -> None:
        """One log line per interval about refused requests, not one per request."""
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at < _LOG_EVERY:
            return
        log.warning(
            "refused %d request(s) without a valid API key; the latest: %s", self._unlogged, what
        )
        self._unlogged = 0
        self._logged_at = now

    def reload(self) -> None:
        """SIGHUP: read the keys file again (keeping the old keys when it is unusable)."""
        if self.keys is None or self.keys.keys_file is None:
            return
        try:
            n = self.keys.reload()
        except (OSError, ValueError) as e:
            log.error(
                "SIGHUP: kept the API keys in force: cannot use %s: %s", self.keys.keys_file, e
            )
            return
        log.info("SIGHUP: %d API keys in force", n)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Re-read the keys file on SIGHUP (when there is one)."""
        if self.keys is not None and self.keys.keys_file is not None:
            loop.add_signal_handler(signal.SIGHUP, self.reload)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.keys is not None and self.keys.keys_file is not None:
            loop.remove_signal_handler(signal.SIGHUP)
