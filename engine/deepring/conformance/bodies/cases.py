"""Whole cases: `request_cases(protocol)`."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from .chat import chat_body
from .context import FAULTS, Ctx
from .messages import messages_body
from .mutation import mutate
from .option_specs import conversion_options
from .responses import responses_body
from .values import chance

BODIES = {"chat": chat_body, "responses": responses_body, "messages": messages_body}


@st.composite
def request_cases(draw, protocol: str) -> dict:
    options = draw(conversion_options())
    faults: set[str] = set()
    if chance(draw, 55):
        kinds = FAULTS["common"] + FAULTS[protocol]
        faults = set(draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=2)))
    ctx = Ctx(draw, protocol, faults, options)
    body: Any = BODIES[protocol](ctx)
    if "mutation" in faults:
        body = mutate(ctx, body)
    encoding = draw(st.sampled_from(["dict", "dict", "dict", "dict", "str", "bytes"]))
    if encoding != "dict":
        text = json.dumps(body, ensure_ascii=draw(st.booleans()))
        body = text if encoding == "str" else text.encode()
    return {"protocol": protocol, "body": body, "options": options, "faults": sorted(faults)}
