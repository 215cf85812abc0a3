"""Request conversion + prompt rendering: deepring_recipe against deepseek-recipe 0.2.0 in one run.

Two requests per protocol (Chat Completions, Responses, Messages):

- long: a 20-turn conversation with 10 tools declared, tool calls and results in history and
  reasoning on the assistant turns;
- short: one user turn, no tools.

One operation = construct the request from the body, `convert(ConversionOptions())`, and
`render_conversation` with the V4.1 encoding. The body is the JSON bytes an HTTP server receives
(what `deepring serve` passes), or with `--body dict` an already-parsed dict.
Requests/s = operations / best wall time of `--repeats` timed loops of at least `--min-seconds`
each. Prints ours, official and the ratio against the 2x target.

Usage: python bench/recipe_render.py [--repeats 3] [--min-seconds 1.0] [--body bytes|dict]
       [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import deepring_recipe as ours
import deepseek_recipe as official
from _machine import describe

TARGET = 2.0
MODEL = "DeepSeek-V4.1-Flash"
TURNS = 20
TOOLS = 10


def schema(i: int) -> dict:
    return {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": f"What tool {i} looks up."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            "filters": {
                "type": "object",
                "properties": {
                    "lang": {"type": "string", "enum": ["en", "de", "zh"]},
                    "since": {"type": "string", "format": "date"},
                },
            },
        },
        "required": ["query"],
    }


def user_text(t: int) -> str:
    return f"Turn {t}: please look into item {t * 7} and compare it with the previous result. " * 3


def answer_text(t: int) -> str:
    return f"Item {t * 7} differs from the previous one in three ways; details follow. " * 4


def reasoning_text(t: int) -> str:
    return f"The user asks about item {t * 7}. I should call a tool first, then summarise. " * 3


def arguments(t: int) -> dict:
    return {"query": f"item {t * 7}", "limit": 5, "filters": {"lang": "en"}}


def chat_body(long: bool) -> dict:
    if not long:
        return {"model": MODEL, "messages": [{"role": "user", "content": user_text(0)}]}
    messages: list[dict] = [{"role": "system", "content": "You are a careful research assistant."}]
    for t in range(TURNS):
        call = f"call_{t}"
        messages += [
            {"role": "user", "content": user_text(t)},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": reasoning_text(t),
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {
                            "name": f"tool_{t % TOOLS}",
                            "arguments": json.dumps(arguments(t)),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call, "content": f"Result {t}: " + "data " * 30},
            {"role": "assistant", "content": answer_text(t), "reasoning_content": "Done."},
        ]
    messages.append({"role": "user", "content": "Summarise everything."})
    tools = [
        {
            "type": "function",
            "function": {"name": f"tool_{i}", "description": f"Tool {i}.", "parameters": schema(i)},
        }
        for i in range(TOOLS)
    ]
    return {"model": MODEL, "messages": messages, "tools": tools}


def responses_body(long: bool) -> dict:
    if not long:
        return {"model": MODEL, "input": user_text(0)}
    items: list[dict] = []
    for t in range(TURNS):
        call = f"call_{t}"
        items += [
            {"role": "user", "content": user_text(t)},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning_text(t)}],
            },
            {
                "type": "function_call",
                "call_id": call,
                "name": f"tool_{t % TOOLS}",
                "arguments": json.dumps(arguments(t)),
            },
            {
                "type": "function_call_output",
                "call_id": call,
                "output": f"Result {t}: " + "data " * 30,
            },
            {"role": "assistant", "content": answer_text(t)},
        ]
    items.append({"role": "user", "content": "Summarise everything."})
    tools = [
        {
            "type": "function",
            "name": f"tool_{i}",
            "description": f"Tool {i}.",
            "parameters": schema(i),
        }
        for i in range(TOOLS)
    ]
    return {
        "model": MODEL,
        "instructions": "You are a careful research assistant.",
        "input": items,
        "tools": tools,
    }


def messages_body(long: bool) -> dict:
    if not long:
        return {
            "model": MODEL,
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": user_text(0)}],
        }
    messages: list[dict] = []
    for t in range(TURNS):
        call = f"toolu_{t}"
        messages += [
            {"role": "user", "content": user_text(t)},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": reasoning_text(t), "signature": "s"},
                    {
                        "type": "tool_use",
                        "id": call,
                        "name": f"tool_{t % TOOLS}",
                        "input": arguments(t),
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call,
                        "content": f"Result {t}: " + "data " * 30,
                    }
                ],
            },
            {"role": "assistant", "content": answer_text(t)},
        ]
    messages.append({"role": "user", "content": "Summarise everything."})
    tools = [
        {"name": f"tool_{i}", "description": f"Tool {i}.", "input_schema": schema(i)}
        for i in range(TOOLS)
    ]
    return {
        "model": MODEL,
        "max_tokens": 4096,
        "system": "You are a careful research assistant.",
        "messages": messages,
        "tools": tools,
    }


BODIES = {"chat": chat_body, "responses": responses_body, "messages": messages_body}
CLASSES = {
    "chat": "ChatCompletionRequest",
    "responses": "ResponsesRequest",
    "messages": "MessagesRequest",
}


def operation(M, protocol: str, body: dict | bytes) -> Callable[[], object]:
    cls = getattr(M, CLASSES[protocol])
    options = M.ConversionOptions()
    encoding = M.DeepseekV41Encoding()

    def run() -> object:
        converted = cls(body).convert(options)
        return encoding.render_conversation(converted.conversation)

    return run


def rate(fn: Callable[[], object], repeats: int, min_seconds: float) -> float:
    # The clock is read once per batch of about 10 ms, not once per operation: reading it costs
    # about as much as a tenth of a 1-turn operation, on both sides alike (timeit does the same).
    fn()  # warm up
    start = time.perf_counter()
    for _ in range(10):
        fn()
    batch = max(1, int(0.1 / max(time.perf_counter() - start, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while True:
            for _ in range(batch):
                fn()
            n += batch
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = min(best, elapsed / n)
    return 1.0 / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--body", choices=("bytes", "dict"), default="bytes")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    print(describe())
    print(f"{args.body} bodies")
    print(f"{'protocol':<10} {'request':<6} {'prompt chars':>12} {'ours req/s':>11} "
          f"{'official':>10} {'ratio':>6}  target {TARGET}x")  # fmt: skip
    results = []
    for protocol, make in BODIES.items():
        for long in (True, False):
            body: dict | bytes = make(long)
            if args.body == "bytes":
                body = json.dumps(body).encode()
            prompt = operation(ours, protocol, body)().prompt
            want = operation(official, protocol, body)().prompt
            if prompt != want:
                print(f"{protocol}: prompts differ between the libraries", file=sys.stderr)
                return 1
            a = rate(operation(ours, protocol, body), args.repeats, args.min_seconds)
            b = rate(operation(official, protocol, body), args.repeats, args.min_seconds)
            kind = "long" if long else "short"
            mark = "ok" if a / b >= TARGET else "BELOW"
            print(f"{protocol:<10} {kind:<6} {len(prompt):>12} {a:>11.0f} {b:>10.0f} "
                  f"{a / b:>6.2f}  {mark}")  # fmt: skip
            results.append(
                {"protocol": protocol, "request": kind, "ours": a, "official": b, "ratio": a / b}
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
