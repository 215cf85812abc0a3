# Generated from the built deepring_recipe._native by tools/gen_stub.py: do not edit by hand;
# annotations come from the tables in that script. Regenerate with `./dev stub`.

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, TypeAlias, final

from typing_extensions import disjoint_base

__all__ = [
    "IMAGE_SPECIAL_TOKEN_ID",
    "AssistantMessage",
    "BytesImageSource",
    "CalcResizeError",
    "ChatCompletionChunk",
    "ChatCompletionChunkGenerator",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "Conversation",
    "ConversationRequest",
    "ConversionError",
    "ConversionOptions",
    "DataUrlImageSource",
    "DeepseekV4Encoding",
    "DeepseekV41Encoding",
    "ImageError",
    "ImageInfo",
    "ImageQuota",
    "ImageResolver",
    "ImageSource",
    "InferenceChunk",
    "InferenceFinishReason",
    "InferenceOptions",
    "LatestReminderMessage",
    "Message",
    "MessagesChunkGenerator",
    "MessagesRequest",
    "MessagesResponse",
    "MessagesStreamEvent",
    "ModelVersion",
    "MultiModalData",
    "OpenCvImagePreprocessor",
    "OutputConstraint",
    "ParsingOptions",
    "PreprocessOptions",
    "PromptUsage",
    "ReasoningContentBehavior",
    "RenderedPrompt",
    "ReqwestImageFetcher",
    "ResponsesChunkGenerator",
    "ResponsesEcho",
    "ResponsesRequest",
    "ResponsesResponse",
    "ResponsesStreamEvent",
    "SpecialToken",
    "SpecialTokens",
    "StreamProcessor",
    "SystemMessage",
    "ThinkingInitialStage",
    "Tokenizer",
    "ToolCall",
    "ToolDefinition",
    "ToolMessage",
    "UrlImageSource",
    "UserMessage",
    "WebSearchBehavior",
    "_Int8Head",
    "__version__",
    "decode_rgb",
    "request_fields",
    "request_outline",
]

_RequestBody: TypeAlias = bytes | str | dict[str, Any]
_Role: TypeAlias = Literal["system", "user", "assistant", "tool", "latest_reminder"]
_ToolChoice: TypeAlias = Literal["auto", "none", "required"]
_ReasoningEffort: TypeAlias = Literal["low", "high", "xhigh", "max"]
_ResponseFormat: TypeAlias = Literal["text", "json_object", "json_schema", "regex"]
_ImageDetail: TypeAlias = Literal["low", "high", "original", "auto"]
_ImageSourceKind: TypeAlias = Literal["data_url", "url", "bytes"]
_Logprobs: TypeAlias = Sequence[tuple[float, Sequence[tuple[int, float]]]]
_ChunkGenerator: TypeAlias = (
    ChatCompletionChunkGenerator | ResponsesChunkGenerator | MessagesChunkGenerator
)
_Event: TypeAlias = ChatCompletionChunk | ResponsesStreamEvent | MessagesStreamEvent

__version__: str
IMAGE_SPECIAL_TOKEN_ID: int

def decode_rgb(data: bytes) -> tuple[int, int, bytes]:
    """The RGB pixels of an image (PNG, JPEG, WebP, GIF's first frame): `(width, height, bytes)`,
    rows of `width * 3` bytes. Not part of the official API: the engine decodes the WebP the
    preprocessor made into what the vision tower reads. ValueError for bytes it cannot decode."""

def request_fields(body: _RequestBody, names: Sequence[str]) -> dict[str, Any]:
    """The named top-level fields of a request body (`bytes | str | dict`) that are present, as a
    dict of Python values: what a server reads besides the protocol request (sampling extensions
    such as `top_k`). Text bodies are scanned once without building the other values, with the
    GIL released when large; ValueError for text that is not JSON."""

def request_outline(
    body: _RequestBody, names: Sequence[str]
) -> tuple[list[str], frozenset[str], dict[str, Any]]:
    """The outline of a request body (`bytes | str | dict`), read in one scan: its top-level keys
    (each once, in order), the string values of every `type` key at any depth (a frozenset), and
    the named top-level fields that are present (a dict, as `request_fields`). What a server
    needs to refuse unknown fields and content it cannot serve without reading the body twice:
    text bodies are scanned without building anything but the named fields, with the GIL
    released when large. ValueError for text that is not JSON."""

class ConversionError(Exception):
    """Raised when a protocol request is invalid or cannot be converted."""

    status_code: int
    body: str

@final
class SpecialToken:
    Bos: SpecialToken
    Eos: SpecialToken
    ThinkingStart: SpecialToken
    ThinkingEnd: SpecialToken
    System: SpecialToken
    User: SpecialToken
    Assistant: SpecialToken
    LatestReminder: SpecialToken
    Dsml: SpecialToken
    Image: SpecialToken
    Ref: SpecialToken
    RefEnd: SpecialToken
    Box: SpecialToken
    BoxEnd: SpecialToken
    Point: SpecialToken
    PointEnd: SpecialToken
    Polygon: SpecialToken
    PolygonEnd: SpecialToken
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __lt__(self, value: SpecialToken, /) -> bool: ...
    def __le__(self, value: SpecialToken, /) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __gt__(self, value: SpecialToken, /) -> bool: ...
    def __ge__(self, value: SpecialToken, /) -> bool: ...
    def __int__(self) -> int: ...
    def default_str(self) -> str: ...

@final
class ModelVersion:
    DeepseekV4Pro: ModelVersion
    DeepseekV41Flash: ModelVersion
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __lt__(self, value: ModelVersion, /) -> bool: ...
    def __le__(self, value: ModelVersion, /) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __gt__(self, value: ModelVersion, /) -> bool: ...
    def __ge__(self, value: ModelVersion, /) -> bool: ...
    def __int__(self) -> int: ...

@final
class Tokenizer:
    """A Hugging Face `tokenizer.json` for prompt encoding and streaming decode.

    `threads` sets how many threads prompt encoding uses; `None` means
    `DEEPRING_TOKENIZER_THREADS`, else every available core."""

    @property
    def threads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @staticmethod
    def from_file(path: str, *, threads: int | None = None) -> Tokenizer: ...
    @staticmethod
    def from_str(text: str, *, threads: int | None = None) -> Tokenizer: ...
    @staticmethod
    def from_pretrained(
        identifier: str,
        revision: str | None = None,
        token: str | None = None,
        *,
        threads: int | None = None,
    ) -> Tokenizer:
        """`tokenizer.json` from a local file or directory, or from the Hugging Face cache for a Hub
        id; never downloaded (the official downloads: recipe/DEVIATIONS.md). `token` is accepted
        for signature compatibility and unused."""
    def with_threads(self, threads: int | None) -> Tokenizer:
        """A tokenizer sharing this vocabulary whose prompt encoding uses `threads` threads
        (`None`: `DEEPRING_TOKENIZER_THREADS`, else every core)."""
    def encode(self, text: str) -> list[int]:
        """Encode with the full vocabulary: special-token spellings become their ids."""
    def encode_plain(self, text: str) -> list[int]:
        """Encode plain text with the BPE model only (no added-vocabulary matching, no BOS)."""
    def encode_prompt(self, prompt: str, special_ranges: Sequence[tuple[int, int]]) -> list[int]:
        """Encode `prompt` whose `special_ranges` (code-point offsets) each hold one added token."""
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_to_id(self, token: str) -> int | None: ...

@final
class ToolCall:
    def __new__(cls, id: str, name: str, arguments: str) -> ToolCall: ...
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> str: ...

@final
class ToolDefinition:
    def __new__(
        cls,
        name: str,
        description: str | None = None,
        parameters: Any = None,
        strict: bool | None = None,
        defer_loading: bool = False,
    ) -> ToolDefinition: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str | None: ...
    @property
    def parameters(self) -> Any: ...
    @property
    def strict(self) -> bool | None: ...
    @property
    def defer_loading(self) -> bool: ...

@disjoint_base
class ImageSource:
    @property
    def kind(self) -> _ImageSourceKind: ...
    @property
    def detail(self) -> _ImageDetail: ...
    @property
    def data_url(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def data(self) -> bytes | None: ...
    @property
    def path(self) -> str: ...

@final
class DataUrlImageSource(ImageSource):
    def __new__(
        cls, data_url: str, detail: _ImageDetail = "high", *, path: str = ...
    ) -> DataUrlImageSource: ...

@final
class UrlImageSource(ImageSource):
    def __new__(
        cls, url: str, detail: _ImageDetail = "high", *, path: str = ...
    ) -> UrlImageSource: ...

@final
class BytesImageSource(ImageSource):
    def __new__(
        cls, data: bytes, detail: _ImageDetail = "high", *, path: str = ...
    ) -> BytesImageSource: ...

class ImageError(Exception):
    """A failure to resolve, fetch, or preprocess images, including request limits."""

    kind: str
    is_retryable: bool

class CalcResizeError(ValueError):
    """The Rust image token calculation did not converge."""

@final
class ImageInfo:
    """A preprocessed image for the inference backend: the encoded WebP bytes and the canvas width
    and height in pixels."""

    def __new__(cls, data: bytes, width: int, height: int) -> ImageInfo: ...
    @property
    def data(self) -> bytes: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...

@final
class MultiModalData:
    """Images in the order their placeholders appear in a prompt."""

    def __new__(cls, images: Sequence[ImageInfo] | None = None) -> MultiModalData: ...
    @property
    def images(self) -> list[ImageInfo]: ...
    def is_empty(self) -> bool: ...
    def image_token_adjustment(self) -> int:
        """Return the number of inference input tokens beyond one per placeholder.

        Each image occupies one placeholder in the prompt but costs its V4.1 image token count;
        the adjustment is the sum of the differences. Raises `CalcResizeError` when fitting an
        image to the token budget does not converge."""

@final
class ImageQuota:
    """The image count and encoded bytes recorded by the completed resolve calls of one request.

    Pass the same quota to every resolve call of a request so that the per-request limits apply
    across them. A call records its sources only once every one of them is preprocessed, so a
    failed call adds nothing."""

    def __new__(cls) -> ImageQuota: ...
    def image_count(self) -> int: ...
    def byte_size(self) -> int: ...

@final
class PreprocessOptions:
    """Options of one preprocessing call."""

    def __new__(
        cls, detail: _ImageDetail, max_dimension_px: int, low_detail_max_dimension_px: int
    ) -> PreprocessOptions: ...
    @property
    def detail(self) -> _ImageDetail: ...
    @property
    def max_dimension_px(self) -> int: ...
    @property
    def low_detail_max_dimension_px(self) -> int: ...

@final
class ReqwestImageFetcher:
    """Downloads image URLs over HTTP(S).

    Without a destination filter it connects to any address; when untrusted clients supply image
    URLs, install one with `with_destination_filter` (SSRF)."""

    def __new__(cls) -> ReqwestImageFetcher: ...
    @staticmethod
    def with_max_bytes(max_bytes: int) -> ReqwestImageFetcher: ...
    def with_destination_filter(
        self, destination_filter: Callable[[str, str], bool]
    ) -> ReqwestImageFetcher:
        """Return a fetcher with this size limit that connects only to allowed addresses.

        `destination_filter(host, address)` receives the host of the image URL or of a redirect
        target and one resolved address as a string (`"10.0.0.1"`), and returns whether the
        fetcher may connect to it. For a host name, only the allowed addresses are connected to;
        a host with none raises `ImageError` with kind `"DestinationRejected"`, as does a callable
        that raises or returns a non-boolean. The returned fetcher uses no proxy. Raises
        `TypeError` when `destination_filter` is not callable."""
    def fetch(self, url: str) -> bytes: ...

@final
class OpenCvImagePreprocessor:
    """Decodes, fits, resamples and encodes one image (named for the official's OpenCV
    implementation; this one uses the Rust `image`, `fast_image_resize` and libwebp)."""

    def __new__(cls) -> OpenCvImagePreprocessor: ...
    def preprocess(self, data: bytes, options: PreprocessOptions) -> ImageInfo: ...

@final
class ImageResolver:
    """Resolves image sources with an explicit fetcher and preprocessor."""

    def __new__(
        cls, fetcher: ReqwestImageFetcher, preprocessor: OpenCvImagePreprocessor
    ) -> ImageResolver: ...
    def resolve(self, sources: Sequence[ImageSource], quota: ImageQuota) -> MultiModalData:
        """Resolve image sources and update the quota; a failed call leaves it unchanged."""

@disjoint_base
class Message:
    @property
    def role(self) -> _Role: ...
    @property
    def content(self) -> str: ...
    @property
    def reasoning_content(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[ToolCall] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def image_sources(self) -> list[ImageSource]: ...
    @property
    def prefix(self) -> bool: ...

@final
class SystemMessage(Message):
    def __new__(
        cls,
        content: str,
        image_sources: Sequence[ImageSource] | None = None,
        tools: Sequence[ToolDefinition] | None = None,
        *,
        image_token: str | None = None,
    ) -> SystemMessage: ...
    @property
    def tools(self) -> list[ToolDefinition] | None: ...

@final
class UserMessage(Message):
    def __new__(
        cls,
        content: str,
        image_sources: Sequence[ImageSource] | None = None,
        *,
        image_token: str | None = None,
    ) -> UserMessage: ...

@final
class AssistantMessage(Message):
    def __new__(
        cls,
        content: str,
        reasoning_content: str | None = None,
        tool_calls: Sequence[ToolCall] | None = None,
        prefix: bool = False,
    ) -> AssistantMessage: ...

@final
class ToolMessage(Message):
    def __new__(
        cls,
        content: str,
        tool_call_id: str | None = None,
        image_sources: Sequence[ImageSource] | None = None,
        *,
        image_token: str | None = None,
    ) -> ToolMessage: ...

@final
class LatestReminderMessage(Message):
    def __new__(cls, content: str) -> LatestReminderMessage: ...

@final
class Conversation:
    def __new__(
        cls,
        messages: Sequence[Message] | None = None,
        *,
        thinking_mode: bool = True,
        tools: Sequence[ToolDefinition] | None = None,
        tool_choice: _ToolChoice = "auto",
        reasoning_effort: _ReasoningEffort | None = None,
        response_format: Literal["text", "json_object"] = "text",
        response_schema: Any = None,
        response_regex: str | None = None,
    ) -> Conversation: ...
    @property
    def messages(self) -> list[Message]: ...
    @property
    def thinking_mode(self) -> bool: ...
    @property
    def tools(self) -> list[ToolDefinition]: ...
    @property
    def tool_choice(self) -> _ToolChoice: ...
    @property
    def reasoning_effort(self) -> _ReasoningEffort | None: ...
    @property
    def response_format(self) -> _ResponseFormat: ...
    @property
    def response_schema(self) -> Any | None: ...
    @property
    def response_regex(self) -> str | None: ...

@final
class SpecialTokens:
    def __new__(
        cls,
        *,
        bos: str | None = None,
        eos: str | None = None,
        thinking_start: str | None = None,
        thinking_end: str | None = None,
        system: str | None = None,
        user: str | None = None,
        assistant: str | None = None,
        latest_reminder: str | None = None,
        dsml: str | None = None,
        image: str | None = None,
        ref: str | None = None,
        ref_end: str | None = None,
        box: str | None = None,
        box_end: str | None = None,
        point: str | None = None,
        point_end: str | None = None,
        polygon: str | None = None,
        polygon_end: str | None = None,
    ) -> SpecialTokens: ...
    def token(self, token: SpecialToken) -> str: ...

@final
class RenderedPrompt:
    @property
    def prompt(self) -> str: ...
    @property
    def special_ranges(self) -> list[tuple[int, int]]: ...
    @property
    def image_sources(self) -> list[ImageSource]: ...

@final
class DeepseekV4Encoding:
    def __new__(cls) -> DeepseekV4Encoding: ...
    def with_tokenizer(self, tokenizer: Tokenizer) -> DeepseekV4Encoding: ...
    def with_special_tokens(self, special_tokens: SpecialTokens) -> DeepseekV4Encoding: ...
    def render_conversation(self, conversation: Conversation) -> RenderedPrompt: ...
    def encode(self, conversation: Conversation) -> list[int]: ...
    def encode_bytes(self, conversation: Conversation) -> bytes:
        """`encode`'s ids as little-endian int32 bytes (`numpy.frombuffer(b, "<i4")`): a
        long prompt's ids without one Python int per token, which a caller would hold
        the GIL to build (~80 ms for an 8 MB prompt, stalling every other thread)."""

@final
class DeepseekV41Encoding:
    def __new__(cls) -> DeepseekV41Encoding: ...
    def with_tokenizer(self, tokenizer: Tokenizer) -> DeepseekV41Encoding: ...
    def with_special_tokens(self, special_tokens: SpecialTokens) -> DeepseekV41Encoding: ...
    def render_conversation(self, conversation: Conversation) -> RenderedPrompt: ...
    def encode(self, conversation: Conversation) -> list[int]: ...
    def encode_bytes(self, conversation: Conversation) -> bytes:
        """`encode`'s ids as little-endian int32 bytes (`numpy.frombuffer(b, "<i4")`): a
        long prompt's ids without one Python int per token, which a caller would hold
        the GIL to build (~80 ms for an 8 MB prompt, stalling every other thread)."""

@final
class ThinkingInitialStage:
    ReasoningStart: ThinkingInitialStage
    ReasoningContinuation: ThinkingInitialStage
    ContentContinuation: ThinkingInitialStage
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __lt__(self, value: ThinkingInitialStage, /) -> bool: ...
    def __le__(self, value: ThinkingInitialStage, /) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __gt__(self, value: ThinkingInitialStage, /) -> bool: ...
    def __ge__(self, value: ThinkingInitialStage, /) -> bool: ...
    def __int__(self) -> int: ...
    def starts_in_reasoning(self) -> bool: ...

@final
class ReasoningContentBehavior:
    FillEmpty: ReasoningContentBehavior
    Reject: ReasoningContentBehavior
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __lt__(self, value: ReasoningContentBehavior, /) -> bool: ...
    def __le__(self, value: ReasoningContentBehavior, /) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __gt__(self, value: ReasoningContentBehavior, /) -> bool: ...
    def __ge__(self, value: ReasoningContentBehavior, /) -> bool: ...
    def __int__(self) -> int: ...

@final
class WebSearchBehavior:
    Drop: WebSearchBehavior
    Reject: WebSearchBehavior
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __lt__(self, value: WebSearchBehavior, /) -> bool: ...
    def __le__(self, value: WebSearchBehavior, /) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __gt__(self, value: WebSearchBehavior, /) -> bool: ...
    def __ge__(self, value: WebSearchBehavior, /) -> bool: ...
    def __int__(self) -> int: ...

@final
class ConversionOptions:
    def __new__(
        cls,
        *,
        default_thinking_mode: bool = True,
        reasoning_content_behavior: ReasoningContentBehavior = ...,
        responses_web_search: WebSearchBehavior = ...,
        messages_web_search: WebSearchBehavior = ...,
        thinking_max_tokens_upper_bound: int = 393216,
        non_thinking_max_tokens_upper_bound: int = 393216,
    ) -> ConversionOptions: ...
    @property
    def default_thinking_mode(self) -> bool: ...
    @property
    def model_versions_by_name(self) -> dict[str, ModelVersion]: ...
    @property
    def thinking_max_tokens_upper_bound(self) -> int: ...
    @property
    def non_thinking_max_tokens_upper_bound(self) -> int: ...
    @property
    def reasoning_content_behavior(self) -> ReasoningContentBehavior: ...
    @property
    def responses_web_search(self) -> WebSearchBehavior: ...
    @property
    def messages_web_search(self) -> WebSearchBehavior: ...
    @property
    def special_tokens(self) -> SpecialTokens: ...
    def with_default_thinking_mode(self, default_thinking_mode: bool) -> ConversionOptions: ...
    def with_reasoning_content_behavior(
        self, reasoning_content_behavior: ReasoningContentBehavior
    ) -> ConversionOptions: ...
    def with_responses_web_search(
        self, responses_web_search: WebSearchBehavior
    ) -> ConversionOptions: ...
    def with_messages_web_search(
        self, messages_web_search: WebSearchBehavior
    ) -> ConversionOptions: ...
    def with_special_tokens(self, special_tokens: SpecialTokens) -> ConversionOptions: ...
    def with_model_alias(self, model: str, model_version: ModelVersion) -> ConversionOptions: ...
    def with_model_versions_by_name(
        self, model_versions_by_name: dict[str, ModelVersion]
    ) -> ConversionOptions: ...
    def with_thinking_max_tokens_upper_bound(
        self, thinking_max_tokens_upper_bound: int
    ) -> ConversionOptions: ...
    def with_non_thinking_max_tokens_upper_bound(
        self, non_thinking_max_tokens_upper_bound: int
    ) -> ConversionOptions: ...

@final
class OutputConstraint:
    @property
    def kind(self) -> str: ...
    @property
    def schema(self) -> str: ...

@final
class InferenceOptions:
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def logprobs(self) -> bool: ...
    @property
    def top_logprobs(self) -> int | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def output_constraint(self) -> OutputConstraint | None: ...

@final
class ParsingOptions:
    def __new__(
        cls,
        *,
        parse_tool_calls: bool = True,
        starts_in_tool_calls: bool = False,
        parse_json_output: bool = False,
        thinking_initial_stage: ThinkingInitialStage | None = None,
        stop_sequences: Sequence[str] | None = None,
        special_tokens: SpecialTokens | None = None,
    ) -> ParsingOptions: ...
    @property
    def parse_tool_calls(self) -> bool: ...
    @parse_tool_calls.setter
    def parse_tool_calls(self, value: bool) -> None: ...
    @property
    def starts_in_tool_calls(self) -> bool: ...
    @starts_in_tool_calls.setter
    def starts_in_tool_calls(self, value: bool) -> None: ...
    @property
    def parse_json_output(self) -> bool: ...
    @parse_json_output.setter
    def parse_json_output(self, value: bool) -> None: ...
    @property
    def thinking_initial_stage(self) -> ThinkingInitialStage | None: ...
    @thinking_initial_stage.setter
    def thinking_initial_stage(self, value: ThinkingInitialStage | None) -> None: ...
    @property
    def stop_sequences(self) -> list[str]: ...
    @stop_sequences.setter
    def stop_sequences(self, value: Sequence[str]) -> None: ...
    @property
    def special_tokens(self) -> SpecialTokens: ...
    @special_tokens.setter
    def special_tokens(self, value: SpecialTokens) -> None: ...

@final
class ConversationRequest:
    def __new__(
        cls, conversation: Conversation, model_version: ModelVersion
    ) -> ConversationRequest: ...
    @property
    def conversation(self) -> Conversation: ...
    @property
    def inference_options(self) -> InferenceOptions: ...
    @property
    def parsing_options(self) -> ParsingOptions: ...
    @property
    def model_version(self) -> ModelVersion: ...
    @property
    def stream(self) -> bool: ...
    def resolve_max_tokens(self, prompt_tokens: int, context_limit: int) -> int: ...

@final
class ChatCompletionRequest:
    def __new__(cls, body: _RequestBody) -> ChatCompletionRequest: ...
    @property
    def model(self) -> str: ...
    def convert(self, options: ConversionOptions) -> ConversationRequest: ...
    @staticmethod
    def chunk_generator(
        request: ConversationRequest, id: str, model: str
    ) -> ChatCompletionChunkGenerator: ...

@final
class ResponsesRequest:
    def __new__(cls, body: _RequestBody) -> ResponsesRequest: ...
    @property
    def model(self) -> str: ...
    def namespace_tool_map(self, options: ConversionOptions) -> dict[str, tuple[str, str]]: ...
    def echo(self) -> ResponsesEcho: ...
    def convert(self, options: ConversionOptions) -> ConversationRequest: ...
    @staticmethod
    def chunk_generator(
        request: ConversationRequest, id: str, model: str
    ) -> ResponsesChunkGenerator: ...

@final
class MessagesRequest:
    def __new__(cls, body: _RequestBody) -> MessagesRequest: ...
    @property
    def model(self) -> str: ...
    def convert(self, options: ConversionOptions) -> ConversationRequest: ...
    @staticmethod
    def chunk_generator(
        request: ConversationRequest, id: str, model: str
    ) -> MessagesChunkGenerator: ...

@final
class PromptUsage:
    """Prompt-side token counts from the backend."""

    def __new__(
        cls, *, prompt_tokens: int = 0, prompt_cache_hit_tokens: int = 0
    ) -> PromptUsage: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def prompt_cache_hit_tokens(self) -> int: ...

@final
class InferenceFinishReason:
    """Backend finish reasons (comparable, not hashable, not equal to ints: as the official)."""

    Stop: InferenceFinishReason
    Length: InferenceFinishReason
    ContentFilter: InferenceFinishReason
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __lt__(self, value: InferenceFinishReason, /) -> bool: ...
    def __le__(self, value: InferenceFinishReason, /) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __gt__(self, value: InferenceFinishReason, /) -> bool: ...
    def __ge__(self, value: InferenceFinishReason, /) -> bool: ...
    def __int__(self) -> int: ...

@final
class InferenceChunk:
    """One backend update, built with `ready`, `text`, `tokens` or `finish`."""

    @property
    def kind(self) -> Literal["ready", "text", "tokens", "finish"]: ...
    @property
    def content(self) -> str | None: ...
    @property
    def token_ids(self) -> list[int] | None: ...
    @property
    def finish_reason(self) -> InferenceFinishReason | None: ...
    @property
    def prompt_usage(self) -> PromptUsage | None: ...
    @property
    def token_count(self) -> int | None: ...
    @property
    def system_fingerprint(self) -> str | None: ...
    @staticmethod
    def ready(
        *, prompt_usage: PromptUsage | None = None, system_fingerprint: str | None = None
    ) -> InferenceChunk: ...
    @staticmethod
    def text(content: str, token_count: int = 0) -> InferenceChunk:
        """Decoded text and the number of tokens it accounts for."""
    @staticmethod
    def tokens(token_ids: Sequence[int], logprobs: _Logprobs | None = None) -> InferenceChunk:
        """Token ids; `logprobs` holds one `(logprob, top_logprobs)` pair per id."""
    @staticmethod
    def finish(finish_reason: InferenceFinishReason) -> InferenceChunk: ...

@final
class ChatCompletionChunkGenerator:
    """Chat Completions chunks for one response; a stream processor consumes it."""

@final
class ResponsesChunkGenerator:
    """Responses events for one response; a stream processor consumes it."""

    def with_namespace_tool_map(
        self, namespace_tool_map: dict[str, tuple[str, str]]
    ) -> ResponsesChunkGenerator:
        """Consume this generator; calls of `namespace::name` tools report namespace and name."""
    def with_echo(self, echo: ResponsesEcho) -> ResponsesChunkGenerator:
        """Consume this generator; response objects report the request settings in `echo`."""

@final
class MessagesChunkGenerator:
    """Messages events for one response; a stream processor consumes it."""

    def __new__(cls, id: str, model: str, thinking_mode: bool) -> MessagesChunkGenerator: ...
    def with_signature(self, signature: str) -> MessagesChunkGenerator:
        """Consume this generator; thinking blocks end with `signature` (default: the id)."""

@final
class ResponsesEcho:
    """Request settings a Responses response object reports; the constructor gives those of an
    unspecified request (temperature and top_p 1.0, no limits)."""

    def __new__(cls) -> ResponsesEcho: ...
    @property
    def instructions(self) -> str | None: ...
    @property
    def max_output_tokens(self) -> int | None: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_logprobs(self) -> int: ...
    @property
    def user(self) -> str | None: ...
    def with_served(
        self,
        *,
        parallel_tool_calls: bool = True,
        max_tool_calls: int | None = None,
        metadata: dict[str, str] | None = None,
        prompt_cache_key: str | None = None,
        safety_identifier: str | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
    ) -> ResponsesEcho:
        """A copy whose response objects report these settings, which the request type does not
        read and the official always reports with these defaults: what a server that honours
        them sets (an addition, recipe/DEVIATIONS.md A2). `metadata`: a dict (None: `{}`)."""

@final
class StreamProcessor:
    """Model output (text or token ids) -> protocol events of one response.

    A `tokens` chunk needs the tokenizer. Stream errors (no tokenizer, a log probability count
    that differs from the id count) raise `RuntimeError` and close the processor."""

    def __new__(
        cls, generator: _ChunkGenerator, options: ParsingOptions, tokenizer: Tokenizer | None = None
    ) -> StreamProcessor: ...
    @property
    def finished(self) -> bool:
        """Completed (finish chunk, stop sequence or `finish`) and not closed; check it after
        every push: a stop sequence finishes the processor at once."""
    def push(self, chunk: InferenceChunk) -> list[_Event]:
        """Process one chunk; `RuntimeError` after completion or close."""
    def finish(self) -> list[_Event]:
        """End the input (as a `Stop` finish); later calls return `[]`, after close they raise."""
    def close(self) -> None:
        """Release the processor without completing it."""

@final
class ChatCompletionChunk:
    """One Chat Completions chunk; `ChatCompletionResponse.accumulate` consumes it."""

    def to_json(self) -> str: ...

@final
class ResponsesStreamEvent:
    """One Responses event; `ResponsesResponse.accumulate` consumes it."""

    def to_json(self) -> str: ...

@final
class MessagesStreamEvent:
    """One Messages event; `MessagesResponse.accumulate` consumes it."""

    def to_json(self) -> str: ...

@final
class ChatCompletionResponse:
    """The non-streaming Chat Completions body, accumulated from chunks."""

    def __new__(
        cls, id: str, model: str, created: int, prompt_tokens: int, prompt_cache_hit_tokens: int
    ) -> ChatCompletionResponse: ...
    def accumulate(self, chunk: ChatCompletionChunk) -> None: ...
    def to_json(self) -> str: ...
    @staticmethod
    def sse_event_name(chunk: ChatCompletionChunk) -> str | None:
        """`None`: chunks are unnamed data events."""
    @staticmethod
    def sse_done_data() -> str | None:
        """`[DONE]`."""

@final
class ResponsesResponse:
    """The non-streaming Responses body, accumulated from events."""

    def __new__(
        cls, id: str, model: str, created: int, prompt_tokens: int, prompt_cache_hit_tokens: int
    ) -> ResponsesResponse: ...
    def accumulate(self, chunk: ResponsesStreamEvent) -> None: ...
    def to_json(self) -> str: ...
    @staticmethod
    def sse_event_name(chunk: ResponsesStreamEvent) -> str | None:
        """The event's `type`."""
    @staticmethod
    def sse_done_data() -> str | None:
        """`None`: no final data message."""

@final
class MessagesResponse:
    """The non-streaming Messages body, accumulated from events."""

    def __new__(
        cls, id: str, model: str, created: int, prompt_tokens: int, prompt_cache_hit_tokens: int
    ) -> MessagesResponse: ...
    def accumulate(self, chunk: MessagesStreamEvent) -> None: ...
    def to_json(self) -> str: ...
    @staticmethod
    def sse_event_name(chunk: MessagesStreamEvent) -> str | None:
        """The event's `type`."""
    @staticmethod
    def sse_done_data() -> str | None:
        """`None`: no final data message."""

@final
class _Int8Head:
    """An int8 LM head weight laid out for the int8-avx2 greedy head's kernel (engine:
    kernels/greedy_int8.py)."""

    ROW_MAX: int
    def __new__(cls, q: bytes, scales: bytes, vocab: int, k: int) -> _Int8Head: ...
    @staticmethod
    def has_avx2() -> bool:
        """Whether this CPU runs the AVX2 kernel."""
    @staticmethod
    def on_openmp() -> bool:
        """Whether parts run on torch's OpenMP (libgomp) team, not on threads of their own."""
    def candidates(
        self, yq: bytes, rows: int, x: bytes, a: bytes, threads: int
    ) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """Each row's candidates: yq rows x k int8 values in -ROW_MAX..=ROW_MAX, x their fp32
        scales, a the fp64 bounds. Returns (best fp32 per row, lost uint8 per row, and per
        candidate its row and token as uint32 and its approximate logit as fp32)."""
    def logits(self, yq: bytes, rows: int, x: bytes, threads: int) -> bytes:
        """Every approximate logit of each row: rows x vocab fp32, the vocabulary in `threads`
        parts."""
