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

    def _conversions(
        self, protocol: str, body: Any, thinking: bool | None = None
    ) -> list[tuple[str, Any]]:
        """(template, ConversationRequest) of each configuration that converts the body (with
        that thinking default only, unless None)."""
        out = []
        for (template, default), options in self.options.items():
            if thinking is not None and default != thinking:
                continue
            try:
                out.append((template, REQUESTS[protocol](body).convert(options)))
            except (ConversionError, ValueError, TypeError, OverflowError, RecursionError):
                continue
        return out

    def valid(self, protocol: str, body: Any) -> bool:
        return bool(self._conversions(protocol, body))

    def greedy(self, protocol: str, body: Any) -> bool:
        """Whether the body decodes greedily on the server: temperature 0 as the recipe
        resolves it. Thinking mode samples at temperature 1 whatever the body says (DeepSeek's
        rule, which the recipe applies), and then two runs of one request agree only where the
        server's seeded sampling does not depend on what else it batches: more than any server
        promises, so agreement is asked of greedy requests only."""
        convs = self._conversions(protocol, body, self.default_thinking)
        return bool(convs) and all(c.inference_options.temperature == 0 for _, c in convs)

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
