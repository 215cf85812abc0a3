"""Hand-written docstrings of the stub (see tables.py)."""

# Docstrings for members whose binding has no Rust doc comment ("Class" or "Class.member").
DOCS: dict[str, str] = {
    "Tokenizer": """A Hugging Face `tokenizer.json` for prompt encoding and streaming decode.

`threads` sets how many threads prompt encoding uses; `None` means
`DEEPRING_TOKENIZER_THREADS`, else every available core.""",
    "Tokenizer.encode": (
        "Encode with the full vocabulary: special-token spellings become their ids."
    ),
    "PromptUsage": "Prompt-side token counts from the backend.",
    "InferenceChunk": "One backend update, built with `ready`, `text`, `tokens` or `finish`.",
    "InferenceChunk.text": "Decoded text and the number of tokens it accounts for.",
    "InferenceChunk.tokens": (
        "Token ids; `logprobs` holds one `(logprob, top_logprobs)` pair per id."
    ),
    "ChatCompletionChunkGenerator": (
        "Chat Completions chunks for one response; a stream processor consumes it."
    ),
    "ResponsesChunkGenerator": "Responses events for one response; a stream processor consumes it.",
    "ResponsesChunkGenerator.with_namespace_tool_map": (
        "Consume this generator; calls of `namespace::name` tools report namespace and name."
    ),
    "ResponsesChunkGenerator.with_echo": (
        "Consume this generator; response objects report the request settings in `echo`."
    ),
    "ResponsesEcho": (
        "Request settings a Responses response object reports; the constructor gives those of"
        " an\nunspecified request (temperature and top_p 1.0, no limits)."
    ),
    "MessagesChunkGenerator": "Messages events for one response; a stream processor consumes it.",
    "MessagesChunkGenerator.with_signature": (
        "Consume this generator; thinking blocks end with `signature` (default: the id)."
    ),
    "ChatCompletionChunk": (
        "One Chat Completions chunk; `ChatCompletionResponse.accumulate` consumes it."
    ),
    "ResponsesStreamEvent": "One Responses event; `ResponsesResponse.accumulate` consumes it.",
    "MessagesStreamEvent": "One Messages event; `MessagesResponse.accumulate` consumes it.",
    "ChatCompletionResponse": "The non-streaming Chat Completions body, accumulated from chunks.",
    "ChatCompletionResponse.sse_event_name": "`None`: chunks are unnamed data events.",
    "ChatCompletionResponse.sse_done_data": "`[DONE]`.",
    "ResponsesResponse": "The non-streaming Responses body, accumulated from events.",
    "ResponsesResponse.sse_event_name": "The event's `type`.",
    "ResponsesResponse.sse_done_data": "`None`: no final data message.",
    "MessagesResponse": "The non-streaming Messages body, accumulated from events.",
    "MessagesResponse.sse_event_name": "The event's `type`.",
    "MessagesResponse.sse_done_data": "`None`: no final data message.",
    "StreamProcessor": """Model output (text or token ids) -> protocol events of one response.

A `tokens` chunk needs the tokenizer. Stream errors (no tokenizer, a log probability count
that differs from the id count) raise `RuntimeError` and close the processor.""",
    "StreamProcessor.finished": (
        "Completed (finish chunk, stop sequence or `finish`) and not closed; check it after\n"
        "every push: a stop sequence finishes the processor at once."
    ),
    "StreamProcessor.push": "Process one chunk; `RuntimeError` after completion or close.",
    "StreamProcessor.finish": (
        "End the input (as a `Stop` finish); later calls return `[]`, after close they raise."
    ),
    "StreamProcessor.close": "Release the processor without completing it.",
}
