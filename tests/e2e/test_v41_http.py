"""V4.1 through serving: `deepring serve --model v41-tiny` (prefill and decode workers, the
prefix cache on) answers a greedy chat request, plain and streamed, with exactly the text offline
decoding of the same request gives (the V4.1 template on both sides); a longer second turn
that shares the first's blocks reports them as cached and still equals a cold offline run (a
fresh engine per request, so nothing of it comes from a cache)."""

from __future__ import annotations

import openai
import torch
from deepring import LLM, SamplingParams

THINKING = {"type": "disabled"}
LONG = " ".join(f"item {i}: the value is {i * 37 % 101}." for i in range(60))  # > 2 blocks


def _offline(bodies: list[dict], max_tokens: int) -> list:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    try:
        return [LLM("v41-tiny", max_model_len=2048).generate(b, params)[0] for b in bodies]
    finally:
        torch.set_flush_denormal(False)  # process-wide; later hypothesis suites refuse it


def test_v41_serving_equals_offline_decoding(start_server):
    first = [{"role": "user", "content": LONG}]
    second = [*first, {"role": "assistant", "content": "noted."},
              {"role": "user", "content": "and item 7?"}]  # fmt: skip
    s = start_server("--model", "v41-tiny", "--max-num-seqs", "4", "--max-model-len", "2048",
                     "--default-thinking", "off")  # fmt: skip
    try:
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0) as c:
            kw = {"model": "v41-tiny", "temperature": 0, "max_tokens": 24,
                  "extra_body": {"thinking": THINKING}}  # fmt: skip
            whole = c.chat.completions.create(messages=first, **kw)
            parts = [
                ch.choices[0].delta.content or ""
                for ch in c.chat.completions.create(messages=first, stream=True, **kw)
                if ch.choices
            ]
            later = c.chat.completions.create(messages=second, **kw)
    finally:
        code = s.stop()
    assert code == 0, s.log()[-4000:]
    want = _offline([{"model": "v41-tiny", "messages": m, "thinking": THINKING}
                     for m in (first, second)], 24)  # fmt: skip
    texts = [w.text.removeprefix("\n") for w in want]  # (the parser drops the answer's newline)
    assert whole.choices[0].message.content == texts[0]
    assert "".join(parts) == texts[0]
    assert whole.usage.completion_tokens == len(want[0].token_ids)
    assert later.choices[0].message.content == texts[1]
    cached = later.usage.prompt_tokens_details.cached_tokens
    assert cached >= 128, later.usage  # at least the first turn's whole blocks
    assert cached < later.usage.prompt_tokens
