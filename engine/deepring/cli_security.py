"""Command-line options for API keys, per-key rate limits and the ring's CURVE keys, and
`deepring ring-keys`.

Everything here is checked before a process starts or a socket is bound: an unreadable keys
file, a malformed rate, a tcp:// ring without CURVE support or without keys is one line on
stderr and exit code 2 (cli_serve). Error messages never quote an API key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepring import env
from deepring.config import RateLimit, check_api_key


def add_api_key_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("API keys and rate limits (docs/configuration.md)")
    g.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="a key clients must send (Authorization: Bearer KEY or x-api-key: KEY); "
        "repeatable; also DEEPRING_API_KEY. With any key, every route but /health needs one",
    )
    g.add_argument(
        "--api-keys-file",
        default=None,
        metavar="PATH",
        help="more keys, one per line (# comments); re-read on SIGHUP",
    )
    g.add_argument(
        "--rate-limit-requests",
        default=None,
        metavar="RATE",
        help="generation requests per API key, e.g. 60/min or 5/s (a bucket of N refilling "
        "over the period); beyond it 429 with Retry-After",
    )
    g.add_argument(
        "--rate-limit-tokens",
        default=None,
        metavar="RATE",
        help="prompt + generated tokens per API key, e.g. 100000/min",
    )


def add_image_url_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Image URLs (docs/configuration.md)")
    g.add_argument(
        "--image-url-hosts",
        default=None,
        metavar="HOSTS",
        help="fetch request images given as http(s) URLs from these hosts only (a comma list; "
        "*.example.com takes its subdomains, * any host), and only at public addresses; "
        "without it an image URL is refused (400) and nothing is fetched",
    )
    g.add_argument(
        "--image-url-allow-private",
        action="store_true",
        help="let --image-url-hosts reach private, loopback and link-local addresses too "
        "(an image store inside the deployment)",
    )


def image_url_settings(args: argparse.Namespace) -> dict:
    """The FrontendConfig fields of the image URL flags."""
    from deepring.protocol.images import UrlPolicy

    policy = UrlPolicy.parse(args.image_url_hosts, args.image_url_allow_private)
    if args.image_url_allow_private and policy is None:
        raise ValueError("--image-url-allow-private needs --image-url-hosts")
    hosts = policy.hosts if policy is not None else ()
    return {"image_url_hosts": hosts, "image_url_allow_private": args.image_url_allow_private}


def add_ring_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ring security (docs/deployment.md)")
    g.add_argument(
        "--ring-keys",
        default=None,
        metavar="DIR",
        help="the CURVE key directory of a tcp:// ring (default: DEEPRING_CACHE_DIR/ring-keys)",
    )
    g.add_argument(
        "--insecure-ring",
        action="store_true",
        help="run a tcp:// ring without CURVE: no authentication, no encryption (a private "
        "network you trust only)",
    )


def api_key_settings(args: argparse.Namespace) -> dict:
    """The FrontendConfig fields of the API key and rate limit flags; ValueError when bad."""
    from deepring.frontend.auth import read_keys_file

    keys = list(args.api_key or [])
    for key in keys:
        check_api_key(key, "--api-key")
    from_env = env.api_key()
    if from_env is not None:
        check_api_key(from_env, "DEEPRING_API_KEY")
        keys.append(from_env)
    if args.api_keys_file is not None:
        try:
            read_keys_file(args.api_keys_file)
        except OSError as e:
            raise ValueError(
                f"--api-keys-file: cannot read {args.api_keys_file}: {e.strerror or e}"
            ) from None
        except UnicodeDecodeError:
            raise ValueError(f"--api-keys-file: {args.api_keys_file} is not UTF-8 text") from None
    return {
        "api_keys": tuple(dict.fromkeys(keys)),
        "api_keys_file": args.api_keys_file,
        "rate_limit_requests": _rate(args.rate_limit_requests, "--rate-limit-requests"),
        "rate_limit_tokens": _rate(args.rate_limit_tokens, "--rate-limit-tokens"),
    }


def _rate(text: str | None, flag: str) -> RateLimit | None:
    if text is None:
        return None
    try:
        return RateLimit.parse(text)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def ring_keys_dir(args: argparse.Namespace) -> Path:
    if args.ring_keys:
        return Path(args.ring_keys).expanduser()
    return env.cache_dir() / "ring-keys"


def ring_settings(
    args: argparse.Namespace, addrs: list[str | None], role: str, create: bool
) -> dict:
    """The ring_keys / insecure_ring fields of a process with ring endpoints `addrs`.
    role: what it needs ("serve", "frontend", "prefill", "decode"); create: make the key
    directory when it does not exist. ValueError when the ring cannot be secured."""
    from deepring.ipc import ring_keys
    from deepring.ipc.curve import curve_available, needs_curve

    if not any(a is not None and needs_curve(a) for a in addrs):
        return {"ring_keys": None, "insecure_ring": bool(args.insecure_ring)}
    if args.insecure_ring:
        print(
            "deepring: warning: --insecure-ring: the tcp:// ring is neither authenticated nor "
            "encrypted; anyone who reaches its ports can join it",
            file=sys.stderr,
            flush=True,
        )
        return {"ring_keys": None, "insecure_ring": True}
    if not curve_available():
        raise ValueError(
            "this pyzmq's libzmq has no CURVE support, so a tcp:// ring cannot be authenticated "
            "or encrypted: install a libzmq built with CURVE, or pass --insecure-ring on a "
            "network you trust"
        )
    directory = ring_keys_dir(args)
    try:
        if create and ring_keys.generate(directory):
            where = "" if role == "serve" else "; copy this directory to every worker host"
            print(f"deepring: created ring keys in {directory}{where}", flush=True)
        keys = ring_keys.load(directory)
    except OSError as e:
        raise ValueError(f"ring keys in {directory}: {e.strerror or e}") from None
    keys.need(server=role in ("serve", "frontend", "decode"), client=role != "frontend")
    return {"ring_keys": str(directory), "insecure_ring": False}


def add_ring_keys_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ring-keys",
        help="create (if missing) and show the CURVE key directory of a tcp:// ring",
    )
    p.add_argument(
        "--ring-keys",
        default=None,
        metavar="DIR",
        help="the key directory (default: DEEPRING_CACHE_DIR/ring-keys)",
    )
    p.set_defaults(func=_ring_keys)


def _ring_keys(args: argparse.Namespace) -> int:
    from deepring.ipc import ring_keys
    from deepring.ipc.curve import curve_available

    if not curve_available():
        print("deepring ring-keys: this libzmq has no CURVE support", file=sys.stderr)
        return 1
    directory = ring_keys_dir(args)
    try:
        created = ring_keys.generate(directory)
        keys = ring_keys.load(directory)
    except (OSError, ValueError) as e:
        print(f"deepring ring-keys: {e}", file=sys.stderr)
        return 1
    print(f"{'created' if created else 'existing'} ring keys in {directory}")
    print(f"server public key: {keys.server_public.decode()}")
    if keys.client_public is not None:
        print(f"client public key: {keys.client_public.decode()}")
    print(f"authorized client keys: {len(keys.authorized)}")
    return 0
