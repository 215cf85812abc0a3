"""Request bodies to engine requests, through deepring_recipe (protocol rules live in Rust).

For each of Chat Completions, Responses and Messages: parse the body, convert it (model name,
sampling, tools, stop sequences, thinking), refuse what serving does not honour (every
top-level field and nested content: protocol.fields, protocol.nested), render and encode the
prompt with the template of the served model's family, resolve max_tokens against the context
length, read the sampling fields the recipe does not expose (protocol.sampling), and build the
stream processor that will
turn the engine's token ids back into protocol events. The frontend and
`LLM` both go through `Recipe`.

Model names: only the served model's names are accepted (the recipe's own defaults,
DeepSeek-V4-Pro and DeepSeek-V4.1-Flash, are replaced), and every accepted name renders with
the served model's template. Any other name gets the recipe's 400 listing the accepted ones.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from deepring_recipe import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    Conversation,
    ConversationRequest,
    ConversionError,
    ConversionOptions,
    MessagesRequest,
    MessagesResponse,
    RenderedPrompt,
    ResponsesRequest,
    ResponsesResponse,
    StreamProcessor,
    Tokenizer,
    request_fields,
)

from deepring.image_spans import EncodedImage
from deepring.protocol import allowed_tools, fields, nested
from deepring.protocol.errors import ApiError, field_error
from deepring.protocol.formats import PromptFormat
from deepring.protocol.images import ImageIntake, ImageSupport
from deepring.protocol.sampling import FIELDS as SAMPLING_FIELDS
from deepring.protocol.sampling import sampling_fields
from deepring.protocol.tokenizer import max_token_bytes
from deepring.sampling.params import SamplingParams
from deepring.structured import build as structured
from deepring.structured.constraint import Constraint
from deepring.structured.grammar import GrammarError, Markers

ProtocolRequest = ChatCompletionRequest | ResponsesRequest | MessagesRequest
ProtocolResponse = type[ChatCompletionResponse] | type[ResponsesResponse] | type[MessagesResponse]

# Bodies above this have their prompt's length bounded before it is encoded (smaller ones encode
# in well under a millisecond, so the exact count comes as cheaply).
BOUND_CHECK_BYTES = 32 << 10


@dataclass(frozen=True)
class Api:
    name: str
    request: type[ChatCompletionRequest] | type[ResponsesRequest] | type[MessagesRequest]
    response: ProtocolResponse
    id_prefix: str


CHAT = Api("chat.completions", ChatCompletionRequest, ChatCompletionResponse, "chatcmpl-")
RESPONSES = Api("responses", ResponsesRequest, ResponsesResponse, "resp_")
MESSAGES = Api("messages", MessagesRequest, MessagesResponse, "msg_")


@dataclass
class Prepared:
    """A converted request, ready to submit."""

    api: Api
    response_id: str
    model: str  # the name the client asked for
    created: int
    stream: bool
    prompt_ids: list[int] | np.ndarray  # the frontend makes long ones int32 arrays off the loop
    params: SamplingParams
    seed: int  # the request's seed, or a fresh random one
    processor: StreamProcessor
    # The prefix cache's TTL class: "agent" when the request declares tools, else "chat"
    # (the X-DeepRing-Cache-Class header overrides it; see docs/configuration.md).
    cache_class: str = "chat"
    # The grammar the output must match (response_format json / regex, tool_choice; see
    # structured.build), None when unconstrained.
    constraint: Constraint | None = None
    # Its images as the workers take them (protocol.images), once resolved: Recipe.prepare
    # leaves them in `pending` (fetching and preprocessing is slow work for a worker thread:
    # Recipe.resolve_images), with prompt_ids holding one placeholder per image until then.
    images: list[EncodedImage] = field(default_factory=list)
    pending: _Pending | None = None


@dataclass(frozen=True)
class _Pending:
    sources: list  # ImageSource, in prompt order
    conv: ConversationRequest
    max_model_len: int


class Offline(NamedTuple):
    """A request body for offline generation (Recipe.encode_offline)."""

    prompt_ids: list[int]
    constraint: Constraint | None
    params: dict[str, Any]  # SamplingParams fields the body implies
    images: Sequence[EncodedImage] = ()  # its images, their spans in prompt_ids


# The body fields offline generation refuses (SamplingParams carries them): the recipe's and
# serving's sampling fields, and streaming.
OFFLINE_SAMPLING = frozenset({
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "max_output_tokens", "seed",
    "stop", "stop_sequences", "logprobs", "top_logprobs", "stream",
    *(name for names in SAMPLING_FIELDS.values() for name in names),
})  # fmt: skip


@dataclass
class _Converted:
    request: ProtocolRequest
    conv: ConversationRequest
    model: str
    responses_extras: tuple | None  # Responses: (namespace tool map, echo)
    allowed_tools: frozenset[str] | None = None  # tool_choice allowed_tools (its names)
    body: bytes | str | dict | None = None  # the body the recipe read, when rewritten


_CHARS_IN_REPR = re.compile(r"RenderedPrompt\(prompt=<(\d+) characters>")


def _prompt_chars(rendered: RenderedPrompt) -> int:
    """The rendered prompt's length in characters, counted in Rust (the binding's repr says
    it): `len(rendered.prompt)` would first build the whole prompt as a Python string while
    holding the GIL, 10-30 ms for 8 MB, which stalls the event loop when many long prompts
    arrive at once. (A length accessor on RenderedPrompt would say it without the repr.)"""
    m = _CHARS_IN_REPR.match(repr(rendered))
    return int(m.group(1)) if m else len(rendered.prompt)


class Recipe:
    """The protocol objects shared by every request: tokenizer, conversion options, encoding."""

    def __init__(
        self,
        tokenizer: str | Path | Tokenizer,
        served_names: Sequence[str],
        prompt_format: PromptFormat,
        default_thinking: bool = True,
        default_max_tokens: int | None = None,
        images: ImageSupport | str = nested.NO_IMAGES,
    ) -> None:
        """default_max_tokens caps the output of requests that set no limit of their own (the
        protocol's default, up to the context length, otherwise). images: what lays out the
        images of a served model with a vision encoder, or why images are refused."""
        if not served_names:
            raise ValueError("a served model needs at least one name")
        if default_max_tokens is not None and default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        self.default_max_tokens = default_max_tokens
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.from_file(str(tokenizer))
        )
        self.prompt_format = prompt_format
        self.served_names = tuple(served_names)
        version = prompt_format.model_version
        self.options = (
            ConversionOptions()
            .with_model_versions_by_name({name: version for name in served_names})
            .with_default_thinking_mode(default_thinking)
        )
        self.encoding = prompt_format.encoding(self.tokenizer)
        self.images, self.no_images = None, None
        if isinstance(images, ImageSupport):
            self.images = ImageIntake(self.tokenizer, images.vocab_size, images.urls)
        else:
            self.no_images = images
        # Known when the tokenizer comes as a file: what bounds a prompt's length before encoding.
        self.max_token_bytes = (
            None if isinstance(tokenizer, Tokenizer) else max_token_bytes(tokenizer)
        )
        # The special tokens output-constraint grammars name (structured.grammar).
        self.markers = Markers(
            think_end=self.tokenizer.token_to_id("</think>"),
            dsml=self.tokenizer.token_to_id("｜DSML｜"),
            v41=prompt_format is PromptFormat.V41,
        )

    def _convert(self, api: Api, body: bytes | str | dict) -> _Converted:
        # tool_choice allowed_tools, which the recipe does not know: the body with the mode as
        # tool_choice, and the allowed names (protocol.allowed_tools).
        again = allowed_tools.rewrite(api.name, body) if allowed_tools.mentioned(body) else None
        if again is None:
            return self._convert_once(api, body)
        body, allowed = again
        return replace(self._convert_once(api, body), allowed_tools=allowed, body=body)

    def _convert_once(self, api: Api, body: bytes | str | dict) -> _Converted:
        try:
            req = api.request(body)
        except RecursionError as e:  # nesting beyond the limit
            raise ApiError(400, str(e)) from None
        except ValueError as e:
            raise fields.explain_parse_error(api.name, body, str(e)) from None
        model = req.model
        extras = None
        try:
            if isinstance(req, ResponsesRequest):
                extras = (req.namespace_tool_map(self.options), req.echo())
            conv = req.convert(self.options)
        except ConversionError as e:
            raise ApiError(e.status_code, str(e), openai_body=e.body) from None
        return _Converted(req, conv, model, extras)

    def _encode(self, conv: ConversationRequest, as_array: bool = False) -> list[int] | np.ndarray:
        """The prompt's ids: a new list, or (as_array) an int32 array built without a Python
        int per token (the GIL is held only to copy the bytes: a long prompt's list took ~80
        ms of it, stalling the event loop while another thread prepared it)."""
        try:
            if as_array:
                data = self.encoding.encode_bytes(conv.conversation)
                return np.frombuffer(data, dtype=np.dtype("<i4"))
            return self.encoding.encode(conv.conversation)  # a new list already
        except (RuntimeError, ValueError) as e:
            raise ApiError(400, f"the prompt could not be encoded: {e}") from None

    def _check_length_bound(self, conversation: Conversation, max_model_len: int) -> None:
        """Refuse, without encoding it, a prompt that cannot fit: a token stands for at most
        max_token_bytes bytes of text, and a character is at least one byte, so the rendered
        prompt has at least ceil(characters / max_token_bytes) tokens (128 bytes for the V4
        tokenizer: a 1024-token context refuses prompts of more than 131,072 characters here)."""
        per_token = self.max_token_bytes
        if per_token is None:
            return
        chars = _prompt_chars(self.encoding.render_conversation(conversation))
        least = -(-chars // per_token)
        if least >= max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens, and the "
                f"prompt ({chars} characters) is at least {least} tokens. Please reduce the "
                "length of the messages.",
            )

    def _constraint(
        self,
        conv: ConversationRequest,
        served: fields.Served | None = None,
        allowed: frozenset[str] | None = None,
    ) -> Constraint | None:
        """The request's output constraint, validated: one llguidance cannot compile is a
        400 naming the problem (never a worker's error). `served`: what serving adds to the
        recipe's constraint (protocol.fields); `allowed`: the tools it may call (tool_choice
        allowed_tools)."""
        served = served or fields.Served()
        if (served.single_call or served.must_call) and structured.is_prefix_continuation(conv):
            raise ApiError(
                400,
                "parallel_tool_calls false cannot be enforced on a prefix continuation (its "
                "output is not constrained)",
            )
        try:
            return structured.for_request(
                conv,
                self.markers,
                single_call=served.single_call,
                must_call=served.must_call,
                output_schema=served.output_schema,
                allowed_tools=allowed,
            )
        except structured.UnknownTool as e:
            raise field_error("tool_choice", str(e)) from None
        except GrammarError as e:
            raise ApiError(400, f"Invalid output constraint: {e}") from None

    def encode(self, api: Api, body: bytes | str | dict) -> list[int]:
        """The prompt token ids of a request body. ApiError when it cannot be served."""
        return self._encode(self._convert(api, body).conv)

    def encode_offline(self, api: Api, body: bytes | str | dict) -> Offline:
        """A request body for offline generation (LLM): its prompt token ids, its output
        constraint and the SamplingParams fields the body implies (a thinking budget). Every
        field is checked as for serving; the sampling fields are refused, because offline
        generation takes them from SamplingParams (a body's temperature would otherwise be
        silently ignored). ApiError when the body cannot be served."""
        c = self._convert(api, body)
        read = body if c.body is None else c.body
        keys, tags, got = fields.outline(read, api.name)
        served = fields.check(api.name, read, c.conv, keys, tags, got, self.no_images)
        named = request_fields(read, [k for k in keys if k in OFFLINE_SAMPLING])
        for name, value in named.items():
            if value is not None and not (name == "stream" and value is False):
                raise field_error(
                    name, f"{name}: offline generation takes sampling from SamplingParams, "
                    "not from the request body"
                )  # fmt: skip
        constraint = self._constraint(c.conv, served, allowed=c.allowed_tools)
        ids, images = self._encode(c.conv), []
        sources = self._image_sources(c.conv, ids)
        if sources:
            ids, images = self.images.expand(ids, self.images.resolve(sources))
            ids = ids.tolist()
        return Offline(ids, constraint, self._budget(c.conv, served), images)

    def _image_sources(self, conv: ConversationRequest, ids) -> list:
        """The request's image sources in prompt order: none unless images are served and the
        prompt holds an image placeholder (only an image source renders one: text never
        encodes to a special token), whatever content brought it (Chat's image_url and file
        parts, Responses' input_image, Messages' image blocks)."""
        if self.images is None:
            return []
        ph = self.images.placeholder
        if not (bool((ids == ph).any()) if isinstance(ids, np.ndarray) else ph in ids):
            return []
        return list(self.encoding.render_conversation(conv.conversation).image_sources)

    def _max_tokens(self, conv: ConversationRequest, n: int, max_model_len: int) -> int:
        """The output limit of a prompt of n tokens (ApiError when none fits)."""
        try:
            max_tokens = conv.resolve_max_tokens(n, max_model_len)
        except ConversionError as e:
            raise ApiError(e.status_code, str(e), openai_body=e.body) from None
        if n + max_tokens > max_model_len:
            # The recipe asks for at least one output token even when the prompt fills the
            # context (it only refuses prompts longer than the context); no worker can serve it.
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens, and the "
                f"prompt alone is {n} tokens, which leaves no room for output. "
                "Please reduce the length of the messages.",
            )
        if conv.inference_options.max_tokens is None and self.default_max_tokens is not None:
            max_tokens = min(max_tokens, self.default_max_tokens)
        return max_tokens

    def resolve_images(self, prep: Prepared) -> Prepared:
        """A prepared request with its pending images fetched, preprocessed and laid out in its
        prompt (slow: call it off the event loop), its output limit resolved again for the
        longer prompt. ApiError when an image cannot be served."""
        pending = prep.pending
        if pending is None or self.images is None:
            return prep
        ids, images = self.images.expand(prep.prompt_ids, self.images.resolve(pending.sources))
        limit = self._max_tokens(pending.conv, len(ids), pending.max_model_len)
        params = replace(prep.params, max_tokens=int(limit))
        return replace(prep, prompt_ids=ids, params=params, images=images, pending=None)

    def _budget(self, conv: ConversationRequest, served: fields.Served) -> dict[str, int]:
        """SamplingParams fields of a thinking budget (thinking.budget_tokens), when the output
        starts in thinking mode and the tokenizer has `</think>`."""
        stage = conv.parsing_options.thinking_initial_stage
        reasoning = stage is not None and stage.starts_in_reasoning()
        if served.thinking_budget is None or not reasoning or self.markers.think_end is None:
            return {}
        return {"thinking_budget": served.thinking_budget, "think_end_id": self.markers.think_end}

    def prepare(
        self, api: Api, body: bytes | str | dict, max_model_len: int, as_array: bool = False
    ) -> Prepared:
        """Parse, convert, encode; resolve limits and sampling; build the stream processor.
        ApiError (with the protocol's status and body) when the request cannot be served.
        as_array: the prompt ids as an int32 array (long prompts, see _encode)."""
        c = self._convert(api, body)
        # The fields are checked as the recipe read them (tool_choice allowed_tools: rewritten).
        read = body if c.body is None else c.body
        # Before the encoding (the costly part): a field refused here costs nothing more.
        keys, tags, got = fields.outline(read, api.name)
        served = fields.check(api.name, read, c.conv, keys, tags, got, self.no_images)
        extra = sampling_fields(api.name, got, c.conv.inference_options)
        if isinstance(body, (bytes, str)) and len(body) > BOUND_CHECK_BYTES:
            self._check_length_bound(c.conv.conversation, max_model_len)
        constraint = self._constraint(c.conv, served, allowed=c.allowed_tools)
        prompt_ids = self._encode(c.conv, as_array)
        conv = c.conv
        # With images, checked again once they are laid out (resolve_images).
        max_tokens = self._max_tokens(conv, len(prompt_ids), max_model_len)
        sources = self._image_sources(conv, prompt_ids)
        io = conv.inference_options
        if io.seed is not None:
            extra["seed"] = io.seed
        seed = extra["seed"] if extra.get("seed") is not None else random.getrandbits(63)
        extra.update(self._budget(conv, served))
        params = SamplingParams(
            temperature=float(io.temperature if io.temperature is not None else 1.0),
            top_p=float(io.top_p if io.top_p is not None else 1.0),
            max_tokens=int(max_tokens),
            **extra,
        )
        response_id = f"{api.id_prefix}{random.getrandbits(96):024x}"
        generator = c.request.chunk_generator(conv, response_id, c.model)
        if c.responses_extras is not None:
            ns_map, echo = c.responses_extras
            reported = fields.responses_echo(served, extra)
            if reported:
                echo = echo.with_served(**reported)
            generator = generator.with_namespace_tool_map(ns_map).with_echo(echo)
        processor = StreamProcessor(generator, conv.parsing_options, self.tokenizer)
        return Prepared(
            api=api,
            response_id=response_id,
            model=c.model,
            created=int(time.time()),
            stream=bool(conv.stream),
            prompt_ids=prompt_ids,
            params=params,
            seed=int(seed),
            processor=processor,
            cache_class="agent" if conv.conversation.tools else "chat",
            constraint=constraint,
            pending=_Pending(sources, conv, max_model_len) if sources else None,
        )
