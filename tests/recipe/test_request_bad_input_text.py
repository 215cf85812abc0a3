"""Invalid text in message content, deepring_recipe against the official wheel: invalid
UTF-8 inside the content of a bytes body, and a lone surrogate in a str content.

Helpers and background: `bad_input.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bad_input import NEST, assert_same, both, content_body

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import summary as S

BAD_UTF8 = {
    "0xff": b"\xff",
    "overlong": b"\xc0\xaf",
    "encoded surrogate": b"\xed\xa0\x80",
    "above U+10FFFF": b"\xf4\x90\x80\x80",
    "truncated": b"\xe6\x97",
    "continuation only": b"\x80",
}


@pytest.mark.parametrize("sequence", list(BAD_UTF8.values()), ids=list(BAD_UTF8))
@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_invalid_utf8_in_content(protocol, sequence):
    text = json.dumps(content_body(protocol, "a" + NEST + "b"))
    body = text.encode().replace(NEST.encode(), sequence)
    mine, theirs = both(protocol, body)
    assert_same(mine, theirs)
    error = mine.get("construct")
    assert error is not None, S.outcome_label(mine)
    assert error["error"] == "ValueError", error
    assert error["message"].startswith("invalid JSON request: "), error
    assert "unicode" in error["message"] or "UTF-8" in error["message"], error


@pytest.mark.parametrize("protocol", S.PROTOCOLS)
def test_lone_surrogate_in_content(protocol):
    mine, theirs = both(protocol, content_body(protocol, "a\ud800b"))
    assert_same(mine, theirs)
    error = mine.get("construct")
    assert error is not None, S.outcome_label(mine)
    assert error["error"] == "UnicodeEncodeError", error  # a ValueError
    assert "surrogates not allowed" in error["message"], error
