"""Which prompt template a model was trained on, decided by its checkpoint.

A DeepSeek V4 checkpoint (`model_type: deepseek_v4`) renders with the V4 template, whose system
part needs no `<｜System｜>` token, so the stock V4 `tokenizer.json` serves it; a V4.1
checkpoint (`deepseek_v41`) renders with the V4.1 template. deepring_recipe names the two
templates by the model versions that introduced them (DeepSeek-V4-Pro, DeepSeek-V4.1-Flash).
"""

from __future__ import annotations

from enum import Enum

from deepring_recipe import DeepseekV4Encoding, DeepseekV41Encoding, ModelVersion, Tokenizer


class PromptFormat(Enum):
    V4 = "deepseek_v4"
    V41 = "deepseek_v41"

    @classmethod
    def of_model_type(cls, model_type: str) -> PromptFormat:
        try:
            return cls(model_type)
        except ValueError:
            raise ValueError(
                f"no prompt template for model_type {model_type!r} "
                f"(known: {', '.join(f.value for f in cls)})"
            ) from None

    @property
    def model_version(self) -> ModelVersion:
        return (
            ModelVersion.DeepseekV4Pro if self is PromptFormat.V4 else ModelVersion.DeepseekV41Flash
        )

    def encoding(self, tokenizer: Tokenizer) -> DeepseekV4Encoding | DeepseekV41Encoding:
        enc = DeepseekV4Encoding() if self is PromptFormat.V4 else DeepseekV41Encoding()
        return enc.with_tokenizer(tokenizer)
