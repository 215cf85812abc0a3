"""Request bodies to engine requests, through deepring_recipe (protocol rules live in Rust).

For each of Chat Completions, Responses and Messages: parse the body, convert it (model name,
sampling, tools, stop sequences, thinking), render and encode the prompt with the encoding of
the resolved model version, resolve max_tokens against the context length, and build the
stream processor that will turn the engine's token ids back into protocol events.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepring.frontend.errors import ApiError

# What the frontend calls, by name: a build of deepring_recipe without them cannot serve.
REQUIRED_API = (
    "ChatCompletionRequest",
    "ResponsesRequest",
    "MessagesRequest",
    "ConversionOptions",
    "ConversionError",
    "ModelVersion",
    "DeepseekV4Encoding",
    "DeepseekV41Encoding",
    "Tokenizer",
    "StreamProcessor",
    "InferenceChunk",
    "InferenceFinishReason",
    "PromptUsage",
    "ChatCompletionResponse",
    "ResponsesResponse",
    "MessagesResponse",
)


@dataclass(frozen=True)
class Api:
    name: str
    request: str  # deepring_recipe class names
    response: str
    id_prefix: str


CHAT = Api("chat.completions", "ChatCompletionRequest", "ChatCompletionResponse", "chatcmpl-")
RESPONSES = Api("responses", "ResponsesRequest", "ResponsesResponse", "resp_")
MESSAGES = Api("messages", "MessagesRequest", "MessagesResponse", "msg_")


@dataclass
class Prepared:
    """A converted request, ready to submit."""

    api: Api
    response_id: str
    model: str
    created: int
    stream: bool
    prompt_ids: list[int]
    sampling: dict
    seed: int
    processor: Any  # deepring_recipe.StreamProcessor
    response_cls: Any  # deepring_recipe.<Proto>Response


def missing_api(recipe: Any) -> list[str]:
    return [name for name in REQUIRED_API if not hasattr(recipe, name)]


class Recipe:
    """The protocol-layer objects shared by every request (tokenizer, options, encodings)."""

    def __init__(self, tokenizer_file: str | Path, served_model_name: str) -> None:
        import deepring_recipe as R

        missing = missing_api(R)
        if missing:
            raise RuntimeError(
                "this build of deepring_recipe lacks the serving API the frontend needs: "
                + ", ".join(missing)
            )
        self.R = R
        self.tokenizer = R.Tokenizer.from_file(str(tokenizer_file))
        # The served name renders as V4.1 (the embedded model's format); the official names
        # keep their own versions.
        self.options = R.ConversionOptions().with_model_alias(
            served_model_name, R.ModelVersion.DeepseekV41Flash
        )
        self.v4 = R.DeepseekV4Encoding().with_tokenizer(self.tokenizer)
        self.v41 = R.DeepseekV41Encoding().with_tokenizer(self.tokenizer)

    def convert(self, api: Api, body: bytes) -> tuple[Any, Any, str, Any]:
        """Parse and convert; returns (protocol request class, conversion, model, extras)."""
        R = self.R
        cls = getattr(R, api.request)
        try:
            req = cls(body)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        except RecursionError as e:  # nesting deeper than the library accepts
            raise ApiError(400, str(e)) from None
        model = req.model
        extras = None
        try:
            if api is RESPONSES:
                extras = (req.namespace_tool_map(self.options), req.echo())
            conv = req.convert(self.options)
        except R.ConversionError as e:
            raise ApiError(e.status_code, str(e), openai_body=e.body) from None
        return cls, conv, model, extras

    def encode(self, conv: Any) -> list[int]:
        enc = self.v4 if conv.model_version == self.R.ModelVersion.DeepseekV4Pro else self.v41
        try:
            return list(enc.encode(conv.conversation))
        except (RuntimeError, ValueError) as e:
            raise ApiError(400, f"the prompt could not be encoded: {e}") from None

    def finish(
        self,
        api: Api,
        cls: Any,
        conv: Any,
        model: str,
        extras: Any,
        prompt_ids: list[int],
        max_model_len: int,
    ) -> Prepared:
        """Resolve limits and sampling, and build the stream processor."""
        R = self.R
        try:
            max_tokens = conv.resolve_max_tokens(len(prompt_ids), max_model_len)
        except R.ConversionError as e:
            raise ApiError(e.status_code, str(e), openai_body=e.body) from None
        io = conv.inference_options
        seed = io.seed if io.seed is not None else random.getrandbits(63)
        sampling = {
            "temperature": float(io.temperature if io.temperature is not None else 1.0),
            "top_p": float(io.top_p if io.top_p is not None else 1.0),
            "max_tokens": int(max_tokens),
        }
        response_id = f"{api.id_prefix}{random.getrandbits(96):024x}"
        generator = cls.chunk_generator(conv, response_id, model)
        if extras is not None:
            ns_map, echo = extras
            generator = generator.with_namespace_tool_map(ns_map).with_echo(echo)
        processor = R.StreamProcessor(generator, conv.parsing_options, self.tokenizer)
        return Prepared(
            api=api,
            response_id=response_id,
            model=model,
            created=int(time.time()),
            stream=bool(conv.stream),
            prompt_ids=prompt_ids,
            sampling=sampling,
            seed=int(seed),
            processor=processor,
            response_cls=getattr(R, api.response),
        )
