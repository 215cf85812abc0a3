"""The expected side, from deepring_recipe: whether a body is a valid request at all, whether
the server decodes it greedily, and how many tokens its prompt renders to.

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

REQUESTS: dict[str, type[ChatCompletionRequest | ResponsesRequest | MessagesRequest]] = {
    "chat": ChatCompletionRequest,
    "responses": ResponsesRequest,
    "messages": MessagesRequest,
}
VERSIONS = {"v4": ModelVersion.DeepseekV4Pro, "v41": ModelVersion.DeepseekV41Flash}
ENCODINGS: dict[str, type[DeepseekV4Encoding | DeepseekV41Encoding]] = {
    "v4": DeepseekV4Encoding,
    "v41": DeepseekV41Encoding,
}


class Oracle:
    def __init__(
        self,
        model: str,
        tokenizer: str | Path | None,
        template: str | None,
        default_thinking: bool | None = None,
    ) -> None:
        """tokenizer / template (v4 | v41): the served model's, to count prompt tokens; without
        a tokenizer, prompt counts are not checked (template None: either template).
        default_thinking: the server's thinking mode for requests that do not choose (None:
        unknown), for `greedy`."""
        self.model = model
        self.default_thinking = default_thinking
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

    def _conversions(self, protocol: str, body: Any) -> list[tuple[str, bool, Any]]:
        """(template, thinking default, ConversationRequest) of each configuration that
        converts the body."""
        out = []
        for (template, thinking), options in self.options.items():
            try:
                out.append((template, thinking, REQUESTS[protocol](body).convert(options)))
            except (ConversionError, ValueError, TypeError, OverflowError, RecursionError):
                continue
        return out

    def valid(self, protocol: str, body: Any) -> bool:
        return bool(self._conversions(protocol, body))

    def expect(self, protocol: str, body: Any) -> tuple[bool, set[int] | None]:
        """For a valid body: (greedy, prompt counts).

        greedy: whether the server decodes it greedily, temperature 0 as the recipe resolves
        it under the server's default thinking mode. Thinking mode samples at temperature 1
        whatever the body says (DeepSeek's rule, which the recipe applies), and two sampled
        runs agree only where the server honours the seed exactly: more than servers promise
        (a seed is an extension on Responses and Messages), so agreement is asked of greedy
        requests only.

        prompt counts: the lengths the prompt renders to under the configurations that convert
        it (None without a tokenizer)."""
        convs = self._conversions(protocol, body)
        mine = [c for _, thinking, c in convs if self.default_thinking in (None, thinking)]
        greedy = bool(mine) and all(c.inference_options.temperature == 0 for c in mine)
        if not self.encodings:
            return greedy, None
        counts = set()
        for template, _, conv in convs:
            try:
                counts.add(len(self.encodings[template].encode(conv.conversation)))
            except (ValueError, RuntimeError):
                continue
        return greedy, counts or None
