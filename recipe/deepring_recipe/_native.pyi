from collections.abc import Sequence
from typing import Any, Literal, TypeAlias, final

__all__ = [
    "ChatCompletionChunk",
    "ChatCompletionChunkGenerator",
    "ChatCompletionResponse",
    "InferenceChunk",
    "InferenceFinishReason",
    "MessagesChunkGenerator",
    "MessagesResponse",
    "MessagesStreamEvent",
    "PromptUsage",
    "ResponsesChunkGenerator",
    "ResponsesEcho",
    "ResponsesResponse",
    "ResponsesStreamEvent",
    "StreamProcessor",
    "Tokenizer",
    "__version__",
]
__version__: str

@final
class Tokenizer:
    """A Hugging Face `tokenizer.json` for prompt encoding and streaming decode.

    `threads` sets how many threads prompt encoding uses; `None` means
    `DEEPRING_TOKENIZER_THREADS`, else every available core.
    """

    @staticmethod
    def from_file(path: str, *, threads: int | None = None) -> Tokenizer: ...
    @staticmethod
    def from_str(text: str, *, threads: int | None = None) -> Tokenizer: ...
    def with_threads(self, threads: int | None) -> Tokenizer:
        """Return a tokenizer sharing this vocabulary with another thread count."""
    @property
    def threads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]:
        """Encode with the full vocabulary: special-token spellings become their ids."""
    def encode_plain(self, text: str) -> list[int]:
        """Encode with the BPE model only: no added-vocabulary matching, no BOS."""
    def encode_prompt(self, prompt: str, special_ranges: Sequence[tuple[int, int]]) -> list[int]:
        """Encode a rendered prompt; each range (code-point offsets) is one added token."""
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_to_id(self, token: str) -> int | None: ...

# --- streaming output processing -------------------------------------------------------------

# Declared with the request bindings (not stubbed yet on this branch): replace these aliases by
# the classes when their stubs land.
_ParsingOptions: TypeAlias = Any  # ParsingOptions
_ConversationRequest: TypeAlias = Any  # ConversationRequest

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
    """Backend finish reasons; output parsing decides the protocol's finish reason."""

    Stop: InferenceFinishReason
    Length: InferenceFinishReason
    ContentFilter: InferenceFinishReason
    def __int__(self) -> int: ...

@final
class InferenceChunk:
    """One backend update, built with `ready`, `text`, `tokens` or `finish`."""

    @staticmethod
    def ready(
        *, prompt_usage: PromptUsage | None = None, system_fingerprint: str | None = None
    ) -> InferenceChunk: ...
    @staticmethod
    def text(content: str, token_count: int = 0) -> InferenceChunk:
        """Decoded text and the number of tokens it accounts for."""
    @staticmethod
    def tokens(
        token_ids: Sequence[int],
        logprobs: Sequence[tuple[float, Sequence[tuple[int, float]]]] | None = None,
    ) -> InferenceChunk:
        """Token ids; `logprobs` holds one `(logprob, top_logprobs)` pair per id."""
    @staticmethod
    def finish(finish_reason: InferenceFinishReason) -> InferenceChunk: ...
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
    @staticmethod
    def _for_request(
        request: _ConversationRequest,
        id: str,
        model: str,
        custom_tools: list[str] | None = None,
    ) -> ResponsesChunkGenerator: ...

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

@final
class MessagesChunkGenerator:
    """Messages events for one response; a stream processor consumes it."""

    def __new__(cls, id: str, model: str, thinking_mode: bool) -> MessagesChunkGenerator: ...
    def with_signature(self, signature: str) -> MessagesChunkGenerator:
        """Consume this generator; thinking blocks end with `signature` (default: the id)."""

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

_Event: TypeAlias = ChatCompletionChunk | ResponsesStreamEvent | MessagesStreamEvent

@final
class StreamProcessor:
    """Model output (text or token ids) -> protocol events of one response.

    A `tokens` chunk needs the tokenizer. Stream errors (no tokenizer, a log probability count
    that differs from the id count) raise `RuntimeError` and close the processor.
    """

    def __new__(
        cls,
        generator: ChatCompletionChunkGenerator | ResponsesChunkGenerator | MessagesChunkGenerator,
        options: _ParsingOptions,
        tokenizer: Tokenizer | None = None,
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
