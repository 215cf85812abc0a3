"""Tokenizer: recorded ids, parallel == sequential == HF per segment, GIL release, fork safety."""

from __future__ import annotations

import json
import os
import threading

import deepring_recipe as ours
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

FRAGMENTS = [
    "hello",
    " world",
    "\n",
    "\r\n",
    "  ",
    "\t",
    "1234567",
    "3.14",
    "日本語",
    "中文内容",
    "カタカナ",
    "😀",
    "👨‍👩‍👧",
    "e\u0301",
    "def f(x):\n    return x\n",
    "<｜User｜>",
    "<think>",
    "｜DSML｜",
    "!!!",
    "'s",
    "\u00a0",
    "\u2028",
    "Ⅻ",
    "Привет",
]
text_st = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=30).map(
    "".join
)


@pytest.fixture(scope="module")
def tok(v41_tokenizer_path):
    return ours.Tokenizer.from_file(str(v41_tokenizer_path))


@pytest.fixture(scope="module")
def hf_plain(v41_tokenizer_path):
    data = json.loads(v41_tokenizer_path.read_text(encoding="utf-8"))
    data["added_tokens"] = []
    return HFTokenizer.from_str(json.dumps(data))


@pytest.fixture(scope="module")
def official_tok(v41_tokenizer_path):
    deepseek_recipe = pytest.importorskip("deepseek_recipe")
    return deepseek_recipe.Tokenizer.from_file(str(v41_tokenizer_path))


def test_recorded_prompts_encode_to_recorded_ids(tok, request_vectors):
    checked = 0
    for case in request_vectors["cases"]:
        for version, r in (case.get("rendered") or {}).items():
            if "token_ids" not in r:
                continue
            ranges = [tuple(x) for x in r["special_ranges"]]
            for threads in (1, 2, 4):
                got = tok.with_threads(threads).encode_prompt(r["prompt"], ranges)
                assert got == r["token_ids"], (case["id"], version, threads)
            checked += 1
    assert checked >= 90


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(text_st, min_size=1, max_size=5), threads=st.integers(1, 4))
def test_prompt_encoding_equals_hf_per_segment(tok, hf_plain, segments, threads):
    prompt, ranges, expected = "", [], []
    for i, seg in enumerate(segments):
        prompt += seg
        if seg:
            expected += hf_plain.encode(seg, add_special_tokens=False).ids
        if i + 1 < len(segments):
            ranges.append((len(prompt), len(prompt) + len("<｜User｜>")))
            prompt += "<｜User｜>"
            expected.append(128803)
    assert tok.with_threads(threads).encode_prompt(prompt, ranges) == expected


@settings(max_examples=200, deadline=None)
@given(text=text_st)
def test_full_vocabulary_encode_matches_official(tok, official_tok, text):
    assert tok.encode(text) == official_tok.encode(text)


def test_long_message_is_split_and_still_exact(tok, hf_plain):
    text = "".join(FRAGMENTS) * 400
    expected = hf_plain.encode(text, add_special_tokens=False).ids
    for threads in (1, 2, 3):
        assert tok.with_threads(threads).encode_prompt(text, []) == expected


def test_bad_input_is_a_clear_error(tok):
    with pytest.raises(RuntimeError, match="not in the added vocabulary"):
        tok.encode_prompt("<｜Nope｜>", [(0, 8)])
    with pytest.raises(ValueError, match="outside the prompt"):
        tok.encode_prompt("ab", [(0, 9)])
    with pytest.raises(ValueError, match="at least 1"):
        tok.with_threads(0)
    with pytest.raises(OSError, match="no-such-file"):
        ours.Tokenizer.from_file("/no-such-file.json")
    with pytest.raises(ValueError, match="failed to load tokenizer"):
        ours.Tokenizer.from_str("{not json")


def test_encoding_releases_the_gil(tok):
    text = "".join(FRAGMENTS) * 4000
    done = threading.Event()
    ticks = 0

    def work():
        for _ in range(3):
            tok.with_threads(1).encode_prompt(text, [])
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks += 1
    t.join()
    # With the GIL held for the whole encode the loop could only run at switch points between
    # calls (a handful of iterations); with it released it spins freely.
    assert ticks > 10_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_after_fork(tok):
    text = "".join(FRAGMENTS) * 200
    expected = tok.with_threads(2).encode_prompt(text, [])  # parent's pool now exists
    pid = os.fork()
    if pid == 0:  # child: must not deadlock on the parent's pool
        code = 0 if tok.with_threads(2).encode_prompt(text, []) == expected else 1
        os._exit(code)
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        threading.Event().wait(0.05)
    os.kill(pid, 9)
    pytest.fail("child deadlocked encoding after fork")
