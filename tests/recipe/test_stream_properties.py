"""Stream processing properties of deepring_recipe alone (hypothesis), for all three protocols:

- every chunking of one model output (whole, per character, random splits, one token id per
  push, random groups of ids with and without log probabilities, one UTF-8 byte token per push)
  gives the same reduced stream (`summary.invariance_problems`: deltas merged, tool calls,
  finish, accumulated response; usage within one usage class). Unlike the official, ours needs
  no allowance for JSON-mode spacing or held pushes (recipe/DEVIATIONS.md);
- multi-byte characters are never split: no U+FFFD that the output did not contain;
- misuse raises RuntimeError with the official messages.

The outputs and chunkings are the conformance suite's strategies (tests/conformance). Examples:
$DEEPRING_PROPERTY_EXAMPLES (default 60 per protocol).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepring_recipe as M
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))
import strategies_streams as ss
import summary as S

EXAMPLES = int(os.environ.get("DEEPRING_PROPERTY_EXAMPLES", "60"))
PROTOCOLS = ("chat", "responses", "messages")


@pytest.fixture(scope="module")
def tokenizer(v41_tokenizer_path):
    return M.Tokenizer.from_file(str(v41_tokenizer_path))


@pytest.fixture(scope="module")
def byte_tokens(v41_tokenizer_path):
    return S.ByteTokens(str(v41_tokenizer_path))


def parsing_options(facts: dict, overrides: dict) -> M.ParsingOptions:
    stage = facts["stage"]
    kwargs = {
        "parse_tool_calls": bool(facts["tools"]),
        "starts_in_tool_calls": facts["required"],
        "parse_json_output": facts["json"],
        "thinking_initial_stage": getattr(M.ThinkingInitialStage, stage) if stage else None,
        "stop_sequences": facts["stops"],
    }
    if overrides:
        kwargs["special_tokens"] = S.special_tokens(M, overrides)
    return M.ParsingOptions(**kwargs)


def generator(protocol: str, thinking: bool, tools: list[str]):
    if protocol == "chat":
        body = {
            "model": "DeepSeek-V4.1-Flash",
            "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled" if thinking else "disabled"},
        }
        converted = M.ChatCompletionRequest(body).convert(M.ConversionOptions())
        return M.ChatCompletionRequest.chunk_generator(converted, "resp_1", "model-x")
    if protocol == "messages":
        return M.MessagesChunkGenerator("resp_1", "model-x", thinking)
    declared: list = [
        {
            "type": "namespace",
            "name": "crm",
            "description": "CRM",
            "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
        }
    ]
    if "apply_patch" in tools:
        declared.append({"type": "custom", "name": "apply_patch"})
    body = {
        "model": "DeepSeek-V4.1-Flash",
        "input": "hi",
        "reasoning": {"effort": "high" if thinking else "none"},
        "tools": declared,
    }
    request = M.ResponsesRequest(body)
    options = M.ConversionOptions()
    namespaces, echo = request.namespace_tool_map(options), request.echo()
    converted = request.convert(options)
    g = M.ResponsesRequest.chunk_generator(converted, "resp_1", "model-x")
    return g.with_namespace_tool_map(namespaces).with_echo(echo)


def run(protocol, case, options, chunking, tokenizer) -> dict:
    thinking = case["facts"]["stage"] is not None
    processor = M.StreamProcessor(
        generator(protocol, thinking, case["facts"]["tools"]), options, tokenizer
    )
    events: list = []
    stopped_early = False
    events += processor.push(
        M.InferenceChunk.ready(
            prompt_usage=M.PromptUsage(prompt_tokens=10, prompt_cache_hit_tokens=3),
            system_fingerprint="fp_x",
        )
    )
    for chunk in S.build_chunks(M, chunking):
        if processor.finished:
            stopped_early = True
            break
        events += processor.push(chunk)
    if processor.finished:
        stopped_early = True
    else:
        events += processor.push(
            M.InferenceChunk.finish(getattr(M.InferenceFinishReason, case["finish"]))
        )
    events += processor.finish()
    texts = []
    for e in events:
        data = json.loads(e.to_json())
        delta = (data.get("choices") or [{}])[0].get("delta", {})
        texts += [v for v in (delta.get("content"), delta.get("reasoning_content")) if v]
        delta = data.get("delta")
        if isinstance(delta, str):
            texts.append(delta)
        elif isinstance(delta, dict):
            texts += [v for k, v in delta.items() if k in ("text", "thinking")]
    with pytest.raises(RuntimeError, match="stream processor has finished"):
        processor.push(M.InferenceChunk.text("x", 1))
    return S.reduce_events(M, protocol, events) | {
        "parsing": S.parsing_summary(M, options),
        "error": None,
        "stopped_early": stopped_early,
        "finished": processor.finished,
        "push_after_finish": "<refused>",
        "texts": texts,
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_chunking_gives_the_same_stream(protocol, tokenizer, byte_tokens, data):
    case = data.draw(ss.stream_cases(protocol), label="case")
    plans = data.draw(ss.chunking_plans(), label="plans")
    overrides = S.special_token_overrides(case.get("options"))
    options = parsing_options(case["facts"], overrides)
    if protocol == "responses" and case.get("stop_override"):
        options.stop_sequences = case["stop_override"]
    text = case["output"]
    note(f"output: {json.dumps(text, ensure_ascii=False)}")
    ids = tokenizer.encode(text)
    byte_ids = byte_tokens.explode(ids)
    results = []
    for plan in plans:
        chunking = ss.materialise(plan, text, ids, byte_ids)
        result = run(protocol, case, options, chunking, tokenizer)
        assert result["problems"] == [], result["problems"]
        if "\ufffd" not in text:
            assert all("\ufffd" not in t for t in result["texts"]), plan
        result.pop("texts")
        results.append((plan, result, ss.usage_class(plan)))
    problems = S.invariance_problems(results, json_mode=False, cross_input=not overrides)
    assert problems == [], "\n".join(problems)


def test_misuse_raises_runtime_errors(tokenizer):
    g = M.MessagesChunkGenerator("r", "m", False)
    p = M.StreamProcessor(g, M.ParsingOptions())
    with pytest.raises(RuntimeError, match="token chunk received without a tokenizer"):
        p.push(M.InferenceChunk.tokens([1]))
    with pytest.raises(RuntimeError, match="stream processor is closed"):
        p.push(M.InferenceChunk.text("x"))
    with pytest.raises(RuntimeError, match="stream processor is closed"):
        p.finish()
    with pytest.raises(RuntimeError, match="chunk generator has been consumed"):
        M.StreamProcessor(g, M.ParsingOptions())
    p = M.StreamProcessor(M.MessagesChunkGenerator("r", "m", False), M.ParsingOptions(), tokenizer)
    with pytest.raises(
        RuntimeError, match="invalid log probabilities: 0 log probabilities for 1 token IDs"
    ):
        p.push(M.InferenceChunk.tokens([1], []))
    with pytest.raises(TypeError, match="expected a protocol chunk generator"):
        M.StreamProcessor(object(), M.ParsingOptions())
    g = M.MessagesChunkGenerator("r", "m", True)
    g.with_signature("s")
    with pytest.raises(RuntimeError, match="chunk generator has been consumed"):
        g.with_signature("t")


def test_inference_chunk_accessors():
    usage = M.PromptUsage(prompt_tokens=7, prompt_cache_hit_tokens=2)
    ready = M.InferenceChunk.ready(prompt_usage=usage, system_fingerprint="fp")
    assert (ready.kind, ready.prompt_usage.prompt_tokens, ready.system_fingerprint) == (
        "ready",
        7,
        "fp",
    )
    text = M.InferenceChunk.text("hi", 3)
    assert (text.kind, text.content, text.token_count, text.token_ids) == ("text", "hi", 3, None)
    tokens = M.InferenceChunk.tokens([1, 2], [(-0.5, [(3, -1.0)]), (-1.0, [])])
    assert (tokens.kind, tokens.token_ids, tokens.content) == ("tokens", [1, 2], None)
    finish = M.InferenceChunk.finish(M.InferenceFinishReason.Length)
    assert finish.finish_reason == M.InferenceFinishReason.Length
    assert M.InferenceFinishReason.Stop != 0
    with pytest.raises(TypeError):
        hash(M.InferenceFinishReason.Stop)
    echo = M.ResponsesEcho()
    assert (echo.temperature, echo.top_p, echo.top_logprobs, echo.instructions) == (
        1.0,
        1.0,
        0,
        None,
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("groups", "text"),
    [([[33, 3574]], "?"), ([[33], [3574]], "?"), ([[33, 3574], [3574]], "?\ufffd")],
)
def test_every_generated_token_counts_even_an_unfinished_character(
    protocol, tokenizer, groups, text
):
    """recipe/DEVIATIONS.md 3: the bytes of a character cut off by the end of the stream are
    dropped, but the tokens that carried them were generated and count, however they were
    grouped (3574 is the first half of a four-byte character; a second one breaks the first)."""
    facts = {"stage": None, "tools": [], "required": False, "json": False, "stops": []}
    case = {"facts": facts, "finish": "Length"}
    chunking = {"mode": "tokens", "groups": [[g, None] for g in groups]}
    result = run(protocol, case, parsing_options(facts, {}), chunking, tokenizer)
    assert result["problems"] == []
    assert "".join(result["texts"]) == text
    usage = result["text"]["usage"]
    assert usage["completion_tokens" if protocol == "chat" else "output_tokens"] == sum(
        len(g) for g in groups
    )


@pytest.mark.parametrize("protocol", ["chat", "responses"])
def test_reasoning_tokens_never_exceed_the_completions(protocol, tokenizer, v41_tokenizer_path):
    """recipe/DEVIATIONS.md R6: reasoning ids whose text re-encodes to more tokens than were
    generated (the official counts the re-encoding: 9 > 8 against a random model) report
    reasoning_tokens = completion_tokens with token-id input; text input keeps the count."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(v41_tokenizer_path))
    triples = ([i, i + 100_003, i + 7_919] for i in range(300, 20_000, 997))
    ids = next(t for t in triples if len(hf.encode(hf.decode(t), add_special_tokens=False).ids) > 3)
    facts = {"stage": "ReasoningStart", "tools": [], "required": False, "json": False, "stops": []}
    case = {"facts": facts, "finish": "Length"}
    chunking = {"mode": "tokens", "groups": [[ids, None]]}
    usage = run(protocol, case, parsing_options(facts, {}), chunking, tokenizer)["text"]["usage"]
    total, details = (
        ("completion_tokens", "completion_tokens_details")
        if protocol == "chat"
        else ("output_tokens", "output_tokens_details")
    )
    assert usage[total] == 3
    assert usage[details]["reasoning_tokens"] == 3
    text = hf.decode(ids)
    chunking = {"mode": "text", "pieces": [[text, 3]]}
    usage = run(protocol, case, parsing_options(facts, {}), chunking, tokenizer)["text"]["usage"]
    assert usage[details]["reasoning_tokens"] == len(hf.encode(text, add_special_tokens=False).ids)
