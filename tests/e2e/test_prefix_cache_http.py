"""The prefix cache through HTTP with the official SDKs: a conversation's next turn reports the
previous turn's full blocks as cached in every protocol's usage, its greedy output equals a
server without the cache, and a restarted server (same cache directory) still hits."""

from __future__ import annotations

import urllib.error
import urllib.request

import anthropic
import openai
import pytest
from e2e_helpers import Server

BLOCK = 128  # the embedded model's cache block
ARGS = ("--max-num-seqs", "4", "--max-model-len", "2048", "--default-max-tokens", "8")
SYSTEM = " ".join(f"rule {i}: answer briefly and precisely." for i in range(90))


@pytest.fixture(scope="module")
def kv_env(tmp_path_factory, server_env):
    # A cache directory of this module's own: other tests' prompts do not hit here.
    env = dict(server_env)
    env["DEEPRING_CACHE_DIR"] = str(tmp_path_factory.mktemp("prefix-cache"))
    return env


def _serve(tmp_path_factory, env, *extra: str) -> Server:
    return Server([*ARGS, *extra], tmp_path_factory.mktemp("serve") / "serve.log", env)


def _chat_turns(url: str) -> list:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello!"}]
        first = c.chat.completions.create(model="tiny", messages=msgs, temperature=0)
        msgs += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ]
        second = c.chat.completions.create(model="tiny", messages=msgs, temperature=0)
    return [first, second]


def _cached_floor(prompt_tokens: int) -> int:
    return (prompt_tokens - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def runs(tmp_path_factory, kv_env):
    """The same two chat turns on a server with the cache, after its restart, and on one
    without the cache."""
    out = {}
    s = _serve(tmp_path_factory, kv_env)
    try:
        out["cache"] = _chat_turns(s.url)
        out["other_protocols"] = _other_protocols(s.url)
        out["bad_class"] = _status_with_class(s.url, "forever")
        out["agent_class"] = _status_with_class(s.url, "Agent")
        out["health"] = s.health()
        with urllib.request.urlopen(f"{s.url}/metrics", timeout=10) as r:
            out["metrics"] = r.read().decode()
    finally:
        assert s.stop() == 0, s.log()[-3000:]
    s = _serve(tmp_path_factory, kv_env)
    try:
        out["restarted"] = _chat_turns(s.url)
    finally:
        assert s.stop() == 0, s.log()[-3000:]
    s = _serve(tmp_path_factory, kv_env, "--no-prefix-cache")
    try:
        out["cold"] = _chat_turns(s.url)
    finally:
        assert s.stop() == 0, s.log()[-3000:]
    return out


def test_the_second_turn_reports_the_first_turns_blocks_as_cached(runs):
    first, second = runs["cache"]
    assert first.usage.model_extra["prompt_cache_hit_tokens"] == 0
    hit = second.usage.model_extra["prompt_cache_hit_tokens"]
    # Turn 1 stored its prompt's full blocks; turn 2's prompt starts with them.
    assert hit >= first.usage.prompt_tokens // BLOCK * BLOCK > 0
    assert hit <= _cached_floor(second.usage.prompt_tokens)
    assert second.usage.prompt_tokens_details.cached_tokens == hit
    assert second.usage.model_extra["prompt_cache_miss_tokens"] == (
        second.usage.prompt_tokens - hit
    )


def test_cached_turns_generate_what_a_server_without_the_cache_does(runs):
    for name in ("cache", "restarted"):
        got = [r.choices[0].message.content for r in runs[name]]
        assert got == [r.choices[0].message.content for r in runs["cold"]], name
    assert all(r.usage.model_extra["prompt_cache_hit_tokens"] == 0 for r in runs["cold"])


def test_a_restarted_server_hits_its_cache_directory(runs):
    first, second = runs["restarted"]
    # Both turns were served before the restart: every full block is in the directory store.
    assert first.usage.model_extra["prompt_cache_hit_tokens"] == _cached_floor(
        first.usage.prompt_tokens
    )
    assert (
        second.usage.model_extra["prompt_cache_hit_tokens"]
        >= (runs["cache"][1].usage.model_extra["prompt_cache_hit_tokens"])
    )


def _other_protocols(url: str) -> dict:
    """Two turns each through the Responses and Messages APIs (their own conversation)."""
    out = {}
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:
        items = [{"role": "user", "content": "Responses first. " + SYSTEM}]
        r1 = c.responses.create(model="tiny", input=items, temperature=0, max_output_tokens=6)
        items += [
            {"role": "assistant", "content": r1.output_text or "ok"},
            {"role": "user", "content": "Again?"},
        ]
        r2 = c.responses.create(model="tiny", input=items, temperature=0, max_output_tokens=6)
        out["responses"] = (r1.usage, r2.usage)
    with anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0) as a:
        msgs = [{"role": "user", "content": "Messages first. " + SYSTEM}]
        m1 = a.messages.create(model="tiny", max_tokens=6, messages=msgs)
        text = "".join(b.text for b in m1.content if b.type == "text") or "ok"
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again?"}]
        m2 = a.messages.create(model="tiny", max_tokens=6, messages=msgs)
        out["messages"] = (m1.usage, m2.usage)
    return out


def test_responses_and_messages_report_cached_tokens(runs):
    r1, r2 = runs["other_protocols"]["responses"]
    assert r1.input_tokens_details.cached_tokens == 0
    assert r2.input_tokens_details.cached_tokens >= r1.input_tokens // BLOCK * BLOCK > 0
    m1, m2 = runs["other_protocols"]["messages"]
    assert (m1.cache_read_input_tokens or 0) == 0
    # Anthropic's input_tokens counts what was not read from the cache.
    assert m2.cache_read_input_tokens >= (m1.input_tokens // BLOCK * BLOCK) > 0
    assert m2.input_tokens + m2.cache_read_input_tokens > m1.input_tokens


def test_health_and_metrics_show_the_prefix_cache(runs):
    prefill = [w for w in runs["health"]["workers"] if w["role"] == "prefill"]
    stats = prefill[0]["prefix_cache"]
    assert stats["hit_tokens"] > 0
    assert stats["hit_blocks_device"] > 0
    assert stats["store_puts"] > 0  # written behind into the directory store
    text = runs["metrics"]
    assert "deepring_prompt_cached_tokens_total" in text
    assert 'deepring_prefix_cache_hit_tokens_total{worker="prefill-0",role="prefill"}' in text


def _status_with_class(url: str, cache_class: str) -> int:
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", "x-deepring-cache-class": cache_class},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_cache_class_header_is_checked(runs):
    assert runs["bad_class"] == 400
    assert runs["agent_class"] == 200
