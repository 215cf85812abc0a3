"""Speculative decoding through serving: `deepring serve --model tiny-trained --speculative
dspark` and `--model v41-tiny --speculative fixed:5` (their prefill and decode workers draft and
verify) answer a greedy chat request, plain and streamed, with exactly the text offline plain
decoding of the same rendered prompt gives."""

from __future__ import annotations

import openai
import pytest
import torch
from deepring import LLM, SamplingParams

THINKING = {"type": "disabled"}  # the same rendering offline and served
MESSAGES = [{"role": "user", "content": "import os\n\ndef walk(path):\n    for name in"}]


@pytest.mark.parametrize(("model", "mode"), [("tiny-trained", "dspark"), ("v41-tiny", "fixed:5")])
def test_speculative_serving_equals_offline_plain_decoding(start_server, model, mode):
    s = start_server("--model", model, "--speculative", mode, "--max-num-seqs", "4",
                     "--max-model-len", "1024", "--default-thinking", "off")  # fmt: skip
    try:
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0) as c:
            kw = {"model": model, "messages": MESSAGES, "temperature": 0,
                  "max_tokens": 40, "extra_body": {"thinking": THINKING}}  # fmt: skip
            whole = c.chat.completions.create(**kw)
            parts = [
                ch.choices[0].delta.content or ""
                for ch in c.chat.completions.create(**kw, stream=True)
                if ch.choices
            ]
    finally:
        code = s.stop()
    assert code == 0, s.log()[-4000:]
    body = {"model": model, "messages": MESSAGES, "thinking": THINKING}
    try:
        want = LLM(model, max_model_len=1024).generate(
            body, SamplingParams(temperature=0, max_tokens=40)
        )[0]
    finally:
        # The engine's CPU set-up flushes denormals process-wide; later suites (hypothesis)
        # refuse to draw floats under it.
        torch.set_flush_denormal(False)
    # The chat parser drops the newline that opens an answer after the closed think block.
    text = want.text.removeprefix("\n")
    assert whole.choices[0].message.content == text
    assert "".join(parts) == text
    assert whole.usage.completion_tokens == len(want.token_ids)
