"""The generic structural mutation (fault "mutation")."""

from __future__ import annotations

import json
from typing import Any

from .context import Ctx


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, sub in value.items():
            out += _paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            out += _paths(sub, (*prefix, index))
    return out


REPLACEMENTS = ["x", None, 1, -1, 1.5, "", True, [], {}, [1], {"a": 1}, "auto", "none"]


def mutate(ctx: Ctx, body: dict) -> dict:
    """Replace the value at a random path by one of another kind, or delete a key."""
    # max_completion_tokens stays a valid integer: the official ignores the field, ours reads it
    # (deviation 1), so a wrongly typed value would be a construction error for ours only
    paths = [p for p in _paths(body) if p and p[0] != "max_completion_tokens"]
    if not paths:
        return body
    path = ctx.pick(paths)
    body = json.loads(json.dumps(body))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and ctx.chance(30):
        del parent[path[-1]]
    else:
        parent[path[-1]] = ctx.pick(REPLACEMENTS)
    return body
