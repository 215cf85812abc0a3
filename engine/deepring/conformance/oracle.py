"""The expected side, from deepring_recipe: whether a body is a valid request at all, and how
many tokens its prompt renders to.

"Valid" is asked of every configuration a DeepSeek server may have (V4 or V4.1 template,
thinking on or off by default): a body that no configuration converts must be refused by any
correct server. A body that converts may still be refused (a server need not implement every
feature), but never with a 5xx.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepring_recipe import (
    ChatCompletionRequest,
    ConversionError,
    ConversionOptions,
    DeepseekV4Encoding,
    DeepseekV41Encoding,
    MessagesRequest,
    ModelVersion,
    ResponsesRequest,
    Tokenizer,
)

REQUESTS = {
    "chat": ChatCompletionRequest,
    "responses": ResponsesRequest,
    "messages": MessagesRequest,
}
VERSIONS = {"v4": ModelVersion.DeepseekV4Pro, "v41": ModelVersion.DeepseekV41Flash}
ENCODINGS = {"v4": DeepseekV4Encoding, "v41": DeepseekV41Encoding}


class Oracle:
    def __init__(self, model: str, tokenizer: str | Path | None, template: str | None) -> None:
        """tokenizer / template (v4 | v41): the served model's, to count prompt tokens; without
        a tokenizer, prompt counts are not checked (template None: either template)."""
        self.model = model
        self.templates = [template] if template else list(VERSIONS)
        self.options = {
            (t, thinking): ConversionOptions()
            .with_model_versions_by_name({model: VERSIONS[t]})
            .with_default_thinking_mode(thinking)
            for t in self.templates
            for thinking in (False, True)
        }
        self.encodings = {}
        if tokenizer is not None:
            tok = Tokenizer.from_file(str(tokenizer))
            self.encodings = {t: ENCODINGS[t]().with_tokenizer(tok) for t in self.templates}

    def _conversions(self, protocol: str, body: Any) -> list[tuple[str, Any]]:
        """(template, ConversationRequest) of each configuration that converts the body."""
        out = []
        for (template, _), options in self.options.items():
            try:
                out.append((template, REQUESTS[protocol](body).convert(options)))
            except (ConversionError, ValueError, TypeError, RecursionError):
                continue
        return out

    def valid(self, protocol: str, body: Any) -> bool:
        return bool(self._conversions(protocol, body))

    def prompt_tokens(self, protocol: str, body: Any) -> set[int] | None:
        """The prompt lengths the body renders to under the configurations that convert it
        (None: no tokenizer, or no configuration converts it)."""
        if not self.encodings:
            return None
        counts = set()
        for template, conv in self._conversions(protocol, body):
            try:
                counts.add(len(self.encodings[template].encode(conv.conversation)))
            except (ValueError, RuntimeError):
                continue
        return counts or None
