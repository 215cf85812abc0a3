"""The token masks of our llguidance tokenizer (finer string-body slices, structured.runtime
._SLICES) equal those of llguidance's default slicer, the reference: along random walks through
random JSON schemas and regexes, every step's mask is compared, then a random allowed token is
taken. The slicer is an optimisation only; this checks it stays one for our vocabulary."""

from __future__ import annotations

import os

import llguidance
import numpy as np
import pytest
from deepring.structured import build
from deepring.structured.runtime import llg_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VOCAB, EOS = 129281, 1
STEPS = 40


@pytest.fixture(scope="module")
def tokenizers():
    path = os.environ["DEEPRING_TEST_TOKENIZER"]
    ours = llg_tokenizer(path, VOCAB, [EOS])
    reference = llguidance.LLTokenizer(path, n_vocab=VOCAB, eos_token=[EOS], slices=None)
    return ours, reference


_STRING = st.one_of(
    st.just({"type": "string"}),
    st.integers(0, 45).map(lambda n: {"type": "string", "maxLength": n}),
    st.tuples(st.integers(0, 5), st.integers(0, 30)).map(
        lambda t: {"type": "string", "minLength": t[0], "maxLength": t[0] + t[1]}
    ),
    st.just({"type": "string", "pattern": "^[a-z ]{2,20}$"}),
    st.just({"type": "string", "format": "date"}),
)
_LEAF = st.one_of(
    _STRING,
    st.just({"type": "integer"}),
    st.just({"type": "number", "minimum": 0}),
    st.just({"type": "boolean"}),
    st.lists(st.text("abc xyz", min_size=1, max_size=12), min_size=1, max_size=3, unique=True).map(
        lambda v: {"enum": v}
    ),
)
_SCHEMA = st.recursive(
    _LEAF,
    lambda children: st.one_of(
        st.builds(lambda s: {"type": "array", "items": s, "minItems": 1}, children),
        st.dictionaries(
            st.text("abcdef", min_size=1, max_size=6), children, min_size=1, max_size=3
        ).map(lambda p: {"type": "object", "properties": p, "required": sorted(p)}),
    ),
    max_leaves=4,
)
_REGEX = st.sampled_from(
    [r"[a-z]{0,7}", r"\w{3,25}", r"(yes|no|maybe)[.!]", r"[^\n]{0,40}", r"\d{1,4}-\d{2}"]
)


def _walk(tokenizers, grammar: str, data) -> None:
    ours, reference = (llguidance.LLMatcher(t, grammar, log_level=0) for t in tokenizers)
    assert not ours.is_error(), ours.get_error()
    for _ in range(STEPS):
        got, want = ours.compute_bitmask(), reference.compute_bitmask()
        assert got == want
        bits = np.unpackbits(np.frombuffer(got, np.uint8), bitorder="little")[:VOCAB]
        allowed = np.flatnonzero(bits)
        if len(allowed) == 0 or ours.is_stopped():
            return
        token = int(allowed[data.draw(st.integers(0, len(allowed) - 1), label="token")])
        assert ours.consume_token(token)
        assert reference.consume_token(token)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_SCHEMA, data=st.data())
def test_json_schema_masks_equal_the_default_slicers(tokenizers, schema, data):
    _walk(tokenizers, build.json_schema(schema).grammar, data)


@settings(max_examples=10, deadline=None)
@given(regex=_REGEX, data=st.data())
def test_regex_masks_equal_the_default_slicers(tokenizers, regex, data):
    _walk(tokenizers, build.regex(regex).grammar, data)


def test_allowed_ids_and_counts_read_from_the_packed_words():
    """TokenMasks reads a refused row's allowed ids and their count from the packed words (the
    nonzero words only, a popcount): equal to unpacking every bit, on empty, sparse, dense and
    sign-bit rows."""
    from deepring.structured.runtime import TokenMasks

    masks = TokenMasks(VOCAB)
    rng = np.random.default_rng(1)
    rows = rng.integers(-(2**31), 2**31, size=(5, masks.words), dtype=np.int64).astype(np.int32)
    rows[0] = 0  # nothing allowed
    rows[1] = 0
    rows[1, [3, 100, 4000]] = [5, np.int32(-(2**31)), 1]  # a few ids, one the sign bit
    rows[2] &= rng.integers(0, 2, size=masks.words).astype(np.int32)  # sparse
    rows[:, -1] &= (1 << (VOCAB % 32)) - 1  # no bits past the vocabulary
    masks._buf = rows
    for r in range(len(rows)):
        want = np.flatnonzero(masks._bits(r))
        assert np.array_equal(masks._ids(r), want), r
        assert masks._count(r) == len(want), r
