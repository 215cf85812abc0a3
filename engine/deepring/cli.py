"""`deepring` command line: serve | frontend | prefill | decode | generate | bench."""

from __future__ import annotations

import argparse
import sys

import deepring_recipe

from deepring import __version__

_NOT_YET = "the {name} subcommand is not implemented yet in this build"


def _version_line() -> str:
    return f"deepring {__version__} (deepring-recipe {deepring_recipe.__version__})"


def _serve(args: argparse.Namespace) -> int:
    print(_version_line())
    print(
        "deepring serve: the serving stack (frontend, prefill and decode processes) has not "
        f"landed yet; nothing to serve for model {args.model!r}. Exiting."
    )
    return 0


def _unimplemented(args: argparse.Namespace) -> int:
    print(_NOT_YET.format(name=args.command), file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepring", description=__doc__)
    parser.add_argument("--version", action="version", version=_version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="frontend + prefill + decode on this machine")
    serve.add_argument("--model", default="tiny", help="model path or 'tiny' (embedded default)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(func=_serve)

    for name, text in [
        ("frontend", "the HTTP frontend role alone"),
        ("prefill", "one prefill worker"),
        ("decode", "one decode worker"),
        ("generate", "offline generation from the command line"),
        ("bench", "benchmarks"),
    ]:
        p = sub.add_parser(name, help=text)
        p.set_defaults(func=_unimplemented)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
