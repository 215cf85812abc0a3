"""Self-check of the conformance strategies and helpers against the official wheel alone.

    .venv/bin/python tests/conformance/selfcheck.py [EXAMPLES]

Runs the request and stream strategies through `summary` on `deepseek_recipe` only and prints:

- per protocol, the histogram of request outcomes (ok / construction errors / conversion
  errors by message), the share of successful conversions and a few coverage counters;
  it also checks that the official is deterministic (the same summary twice), that rendering
  never raises, and that the harness itself works;
- per protocol, a histogram of stream outcomes and the number of outputs whose reduced form
  depends on the chunking beyond the tolerated, documented official quirks (expected: 0),
  the same for raw token-id sequences;
- minimal examples of the official's own chunking dependence.

EXAMPLES (default 300) is the number of generated cases per protocol and part.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "fixtures"))

import deepseek_recipe as official  # noqa: E402
import strategies_streams as ss  # noqa: E402
import summary as S  # noqa: E402
from deepring.conformance import bodies as sr  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from v41_tokenizer import write_fixture  # noqa: E402

DEFAULT_TOKENIZER = HERE.parent.parent / "target" / "test-fixtures" / "deepseek-v41-tokenizer.json"


def run_hypothesis(strategy, examples: int, body) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def inner(value):
        body(value)

    inner()


def request_part(protocol: str, examples: int, tokenizer) -> bool:
    outcomes: collections.Counter = collections.Counter()
    coverage: collections.Counter = collections.Counter()
    failures: list[str] = []

    def body(case):
        summary = S.request_summary(official, case, tokenizer)
        label = S.outcome_label(summary)
        outcomes[label] += 1
        again = S.request_summary(official, case, tokenizer)
        if S.canonical_json(again) != S.canonical_json(summary):
            failures.append(f"nondeterministic: {json.dumps(str(case['body']))[:300]}")
        adjusted = S.adjust_for_deviations(case, summary, again)
        if S.canonical_json(adjusted[0]) != S.canonical_json(adjusted[1]):
            failures.append("deviation adjustment is not symmetric")
        coverage["faulty case" if case["faults"] else "fault-free case"] += 1
        if case["faults"] and label == "ok":
            coverage["faulty case that converted"] += 1
        if not case["faults"] and label != "ok":
            coverage["fault-free case that failed"] += 1
        if S.has_max_completion_tokens(case):
            coverage["deviation 1 (max_completion_tokens)"] += 1
        if S.strict_defs_deviation(case):
            coverage["deviation 2 (strict $defs)"] += 1
        if isinstance(case["body"], (str, bytes)):
            coverage["body as " + type(case["body"]).__name__] += 1
        if case["options"]:
            coverage["non-default options"] += 1
        if "conversation" not in summary:
            return
        conversation = summary["conversation"]
        coverage["thinking" if conversation["thinking_mode"] else "non-thinking"] += 1
        if conversation["tools"]:
            coverage["tools"] += 1
        if any(t["strict"] for t in conversation["tools"]):
            coverage["strict tools"] += 1
        messages = conversation["messages"]
        if any(m["tool_calls"] for m in messages):
            coverage["tool-call history"] += 1
        if any(m["images"] for m in messages):
            coverage["images"] += 1
        if any(m["prefix"] for m in messages):
            coverage["prefix continuation"] += 1
        if any(m["role"] == "latest_reminder" for m in messages):
            coverage["latest_reminder"] += 1
        if any(m["reasoning_content"] for m in messages):
            coverage["history reasoning"] += 1
        if any(m.get("tools") for m in messages):
            coverage["system message tools (tool_addition)"] += 1
        coverage["response_format=" + conversation["response_format"]] += 1
        for name, rendered in summary["rendered"].items():
            if "render_error" in rendered:
                failures.append(f"render error {name}: {rendered['render_error']}")
            elif isinstance(rendered.get("ids"), dict):
                coverage["encode error: " + rendered["ids"]["message"][:60]] += 1
            elif "ids" in rendered:
                coverage["encoded " + name] += 1

    start = time.perf_counter()
    run_hypothesis(sr.request_cases(protocol), examples, body)
    elapsed = time.perf_counter() - start
    total = sum(outcomes.values())
    print(f"\n=== requests: {protocol}: {total} cases in {elapsed:.1f}s")
    print(f"    ok: {outcomes['ok']} ({100 * outcomes['ok'] / total:.0f}%), ", end="")
    print(f"distinct error outcomes: {len(outcomes) - ('ok' in outcomes)}")
    for label, count in outcomes.most_common():
        print(f"    {count:5d}  {label}")
    print("    coverage:")
    for label, count in sorted(coverage.items()):
        print(f"    {count:5d}  {label}")
    for failure in failures[:10]:
        print("    FAILURE:", failure)
    return not failures


def stream_part(protocol: str, examples: int, tokenizer, byte_tokens) -> bool:
    outcomes: collections.Counter = collections.Counter()
    failures: list[str] = []

    def body(drawn):
        case, plans = drawn
        text = case["output"]
        ids = tokenizer.encode(text)
        byte_ids = byte_tokens.explode(ids)
        results = []
        for plan in plans:
            result = S.run_stream(
                official, case, ss.materialise(plan, text, ids, byte_ids), tokenizer
            )
            if result["problems"] or result["error"]:
                failures.append(f"{result['problems']} {result['error']}")
            results.append((plan, result, ss.usage_class(plan)))
        whole = results[0][1]
        again = S.run_stream(
            official, case, ss.materialise(plans[0], text, ids, byte_ids), tokenizer
        )
        if S.canonical_json(again) != S.canonical_json(whole):
            failures.append(f"nondeterministic: {json.dumps(text, ensure_ascii=False)}")
        problems = S.invariance_problems(
            results,
            json_mode=whole["parsing"]["parse_json_output"],
            cross_input=not case["options"],
        )
        if problems:
            failures.append(
                f"chunking-dependent: {json.dumps(text, ensure_ascii=False)} {problems}"
            )
        outcomes["stopped by a stop sequence" if whole["stopped_early"] else "ran to finish"] += 1
        reduced = whole["text"]
        if protocol == "chat":
            outcomes[f"finish_reason={reduced['finish_reason']}"] += 1
            outcomes[f"tool calls={len(reduced['tool_calls'])}"] += 1
            if reduced["reasoning"]:
                outcomes["has reasoning"] += 1
            if reduced["content"]:
                outcomes["has content"] += 1
        elif protocol == "responses":
            outcomes[f"terminal={reduced['terminal'][0]}"] += 1
            for item in reduced["items"]:
                outcomes[f"item {item[1]}"] += 1
        else:
            outcomes[f"stop_reason={reduced['stop'][0]}"] += 1
            for block in reduced["blocks"]:
                outcomes[f"block {block[1]}"] += 1
        stage = whole["parsing"]["thinking_initial_stage"]
        outcomes[f"stage={stage}"] += 1
        if whole["parsing"]["parse_json_output"]:
            outcomes["json output mode"] += 1
        if whole["parsing"]["starts_in_tool_calls"]:
            outcomes["starts in tool calls"] += 1

    start = time.perf_counter()
    run_hypothesis(st.tuples(ss.stream_cases(protocol), ss.chunking_plans()), examples, body)
    elapsed = time.perf_counter() - start
    print(f"\n=== streams: {protocol}: {examples} outputs x 7 chunkings in {elapsed:.1f}s")
    for label, count in sorted(outcomes.items()):
        print(f"    {count:5d}  {label}")
    print(f"    chunking-dependent (beyond documented quirks) or failing: {len(failures)}")
    for failure in failures[:5]:
        print("    FAILURE:", failure[:500])

    soup: collections.Counter = collections.Counter()
    soup_failures: list[str] = []

    def soup_body(case):
        results = []
        for plan in case["plans"]:
            chunking = ss.materialise(plan, "", case["ids"], [])
            results.append((plan, S.run_stream(official, case, chunking, tokenizer), "tokens"))
        if byte_tokens.silent_tail(case["ids"]):
            soup["silent tail (invariance not checked)"] += 1
            return
        soup["checked"] += 1
        json_mode = results[0][1]["parsing"]["parse_json_output"]
        problems = S.invariance_problems(results, json_mode=json_mode, cross_input=False)
        if problems:
            soup_failures.append(f"{case['ids']}: {problems}")

    run_hypothesis(ss.token_soup_cases(protocol), examples, soup_body)
    print(f"    token-id soup: {dict(soup)}, grouping-dependent: {len(soup_failures)}")
    for failure in soup_failures[:5]:
        print("    FAILURE:", failure[:300])
    return not failures and not soup_failures


def quirks(tokenizer, byte_tokens) -> None:
    """Minimal examples of the official's own chunking / input-kind dependence."""
    print("\n=== official chunking dependence (minimal examples)")

    def chat(body_extra: dict, chunking: dict) -> dict:
        body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "json"}]}
        case = {"protocol": "chat", "body": body | body_extra, "options": {}, "ready": True}
        return S.run_stream(official, case, chunking, tokenizer)["text"]

    def text(pieces):
        return {"mode": "text", "pieces": [[p, 1] for p in pieces]}

    def ids(groups):
        return {"mode": "tokens", "groups": [[g, None] for g in groups]}

    json_mode = {"thinking": {"type": "disabled"}, "response_format": {"type": "json_object"}}
    source = 'Sure\n```json\n{"a": 1}\n```\nDone.'
    for name, chunking in (("whole", text([source])), ("per char", text(list(source)))):
        print(f"  json_object {name}: content {chat(json_mode, chunking)['content']!r}")
    thinking = {"thinking": {"type": "enabled"}}
    source = "a<\n\n</think>b"
    for name, chunking in (
        ("text", text([source])),
        ("token ids", ids([tokenizer.encode(source)])),
    ):
        print(f"  {source!r} as {name}: reasoning {chat(thinking, chunking)['reasoning']!r}")
    plain = {"thinking": {"type": "disabled"}}
    for groups in ([[33, 3574]], [[33], [3574]], [[33, 129999]], [[33], [129999]]):
        reduced = chat(plain, ids(groups))
        print(
            f"  token pushes {groups}: content {reduced['content']!r}, "
            f"completion_tokens {reduced['usage']['completion_tokens']}"
        )
    spelled = [byte_tokens.byte_id[b] for b in b"ab</think>cd"]
    reduced = chat(thinking, ids([spelled]))
    print(f"  '</think>' spelled with byte tokens: reasoning {reduced['reasoning']!r}")


def main() -> int:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    path = write_fixture(Path(os.environ.get("DEEPRING_TEST_TOKENIZER", DEFAULT_TOKENIZER)))
    tokenizer = official.Tokenizer.from_file(str(path))
    byte_tokens = S.ByteTokens(str(path))
    ok = True
    for protocol in S.PROTOCOLS:
        ok &= request_part(protocol, examples, tokenizer)
    for protocol in S.PROTOCOLS:
        ok &= stream_part(protocol, examples, tokenizer, byte_tokens)
    quirks(tokenizer, byte_tokens)
    print("\nselfcheck", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
