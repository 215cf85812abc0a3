"""Generate recipe/deepring_recipe/_native.pyi from the built `deepring_recipe._native` module.

Usage (from the repository root, with the native module built into .venv):

    python tools/gen_stub.py            # rewrite the stub (also: ./dev stub)
    python tools/gen_stub.py --check    # exit 1 with a diff when the committed stub is stale
    python tools/gen_stub.py --stdout   # print the stub instead of writing it

What comes from the runtime: every public name of the module (classes, exceptions and their
bases, functions, constants, `__all__`), each class's constructor, methods, static and class
methods (names, parameter kinds and defaults from `__text_signature__`), properties (read-only or
writable), enum-like members, class attributes, `@final` (not subclassable) and docstrings.

What comes from the tables below: the annotations. `TYPES` maps class -> member -> annotation (a
string for a property, a dict of parameter name -> annotation plus "return" for a callable;
"{cls}" stands for the class's own name, "*" for every parameter not named). The "*" class holds
members shared by several classes, the "" class module-level functions and constants, and
`PARAMS` parameter names that mean the same thing wherever they occur. A parameter whose default
is `None` gets `| None` added. Anything the tables do not cover is typed `Any` and listed on
stderr, so a new binding still yields a stub that passes stubtest; add it to the tables to type
it. `DOCS` keeps hand-written docstrings for members whose
Rust side has no doc comment (a doc comment on the binding takes precedence).

The output is formatted with `ruff format` (pinned in requirements/dev.txt) so that
`ruff format --check` agrees with it.
"""

from __future__ import annotations

import argparse
import ctypes
import difflib
import importlib
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODULE = "deepring_recipe._native"
STUB = ROOT / "recipe" / "deepring_recipe" / "_native.pyi"

# --- annotation tables -------------------------------------------------------------------------

# Private aliases, emitted only when the stub uses them (private names are not checked against
# the runtime by stubtest).
ALIASES: dict[str, str] = {
    "_RequestBody": "bytes | str | dict[str, Any]",
    "_Role": 'Literal["system", "user", "assistant", "tool", "latest_reminder"]',
    "_ToolChoice": 'Literal["auto", "none", "required"]',
    "_ReasoningEffort": 'Literal["low", "high", "xhigh", "max"]',
    "_ResponseFormat": 'Literal["text", "json_object", "json_schema", "regex"]',
    "_ImageDetail": 'Literal["low", "high", "original", "auto"]',
    "_ImageSourceKind": 'Literal["data_url", "url", "bytes"]',
    "_Logprobs": "Sequence[tuple[float, Sequence[tuple[int, float]]]]",
    "_ChunkGenerator": (
        "ChatCompletionChunkGenerator | ResponsesChunkGenerator | MessagesChunkGenerator"
    ),
    "_Event": "ChatCompletionChunk | ResponsesStreamEvent | MessagesStreamEvent",
}

# Parameter names with one meaning across the module.
PARAMS: dict[str, str] = {
    "arguments": "str",
    "body": "_RequestBody",
    "content": "str",
    "context_limit": "int",
    "conversation": "Conversation",
    "created": "int",
    "data": "bytes",
    "data_url": "str",
    "default_thinking_mode": "bool",
    "defer_loading": "bool",
    "description": "str",
    "detail": "_ImageDetail",
    "echo": "ResponsesEcho",
    "finish_reason": "InferenceFinishReason",
    "generator": "_ChunkGenerator",
    "id": "str",
    "ids": "Sequence[int]",
    "image_sources": "Sequence[ImageSource]",
    "image_token": "str",
    "logprobs": "_Logprobs",
    "messages": "Sequence[Message]",
    "messages_web_search": "WebSearchBehavior",
    "model": "str",
    "model_version": "ModelVersion",
    "model_versions_by_name": "dict[str, ModelVersion]",
    "name": "str",
    "namespace_tool_map": "dict[str, tuple[str, str]]",
    "non_thinking_max_tokens_upper_bound": "int",
    "parameters": "Any",
    "parse_json_output": "bool",
    "parse_tool_calls": "bool",
    "path": "str",
    "prefix": "bool",
    "prompt": "str",
    "prompt_cache_hit_tokens": "int",
    "prompt_tokens": "int",
    "prompt_usage": "PromptUsage",
    "reasoning_content": "str",
    "reasoning_content_behavior": "ReasoningContentBehavior",
    "reasoning_effort": "_ReasoningEffort",
    "request": "ConversationRequest",
    "response_format": 'Literal["text", "json_object"]',
    "response_regex": "str",
    "response_schema": "Any",
    "responses_web_search": "WebSearchBehavior",
    "signature": "str",
    "special_ranges": "Sequence[tuple[int, int]]",
    "special_tokens": "SpecialTokens",
    "starts_in_tool_calls": "bool",
    "stop_sequences": "Sequence[str]",
    "strict": "bool",
    "system_fingerprint": "str",
    "text": "str",
    "thinking_initial_stage": "ThinkingInitialStage",
    "thinking_max_tokens_upper_bound": "int",
    "thinking_mode": "bool",
    "threads": "int | None",
    "token_count": "int",
    "token_ids": "Sequence[int]",
    "tokenizer": "Tokenizer",
    "tool_call_id": "str",
    "tool_calls": "Sequence[ToolCall]",
    "tool_choice": "_ToolChoice",
    "tools": "Sequence[ToolDefinition]",
    "url": "str",
}

_RESPONSE = {
    "accumulate": {"return": "None"},
    "to_json": {"return": "str"},
    "sse_event_name": {"return": "str | None"},
    "sse_done_data": {"return": "str | None"},
}
_REQUEST = {"model": "str", "convert": {"options": "ConversionOptions"}}
_MESSAGE = {
    "role": "_Role",
    "content": "str",
    "reasoning_content": "str | None",
    "tool_calls": "list[ToolCall] | None",
    "tool_call_id": "str | None",
    "image_sources": "list[ImageSource]",
    "prefix": "bool",
}

# Class -> member -> annotation. A property is a string, or a (getter, setter value) pair when
# the setter takes a wider type; a callable is a dict of parameter -> annotation and "return".
# Properties are emitted in the order listed here, then alphabetically.
TYPES: dict[str, dict[str, Any]] = {
    "*": {
        "convert": {"return": "ConversationRequest"},
        "encode": {"return": "list[int]"},
        "model": "str",
        "render_conversation": {"return": "RenderedPrompt"},
        "to_json": {"return": "str"},
        "with_special_tokens": {"return": "{cls}"},
        "with_tokenizer": {"return": "{cls}"},
    },
    # errors, tokens, model versions
    "ConversionError": {"status_code": "int", "body": "str"},
    "SpecialToken": {"default_str": {"return": "str"}},
    "SpecialTokens": {"__new__": {"*": "str"}, "token": {"token": "SpecialToken", "return": "str"}},
    "Tokenizer": {
        "from_file": {"return": "Tokenizer"},
        "from_str": {"return": "Tokenizer"},
        "with_threads": {"return": "Tokenizer"},
        "threads": "int",
        "vocab_size": "int",
        "encode_plain": {"return": "list[int]"},
        "encode_prompt": {"return": "list[int]"},
        "decode": {"return": "str"},
        "token_to_id": {"token": "str", "return": "int | None"},
    },
    # conversations
    "ToolCall": {"id": "str", "name": "str", "arguments": "str"},
    "ToolDefinition": {
        "name": "str",
        "description": "str | None",
        "parameters": "Any",
        "strict": "bool | None",
        "defer_loading": "bool",
    },
    "ImageSource": {
        "kind": "_ImageSourceKind",
        "detail": "_ImageDetail",
        "data_url": "str | None",
        "url": "str | None",
        "data": "bytes | None",
        "path": "str",
    },
    "Message": _MESSAGE,
    "SystemMessage": {"tools": "list[ToolDefinition] | None"},
    "Conversation": {
        "messages": "list[Message]",
        "thinking_mode": "bool",
        "tools": "list[ToolDefinition]",
        "tool_choice": "_ToolChoice",
        "reasoning_effort": "_ReasoningEffort | None",
        "response_format": "_ResponseFormat",
        "response_schema": "Any | None",
        "response_regex": "str | None",
    },
    "RenderedPrompt": {
        "prompt": "str",
        "special_ranges": "list[tuple[int, int]]",
        "image_sources": "list[ImageSource]",
    },
    # options and requests
    "ThinkingInitialStage": {"starts_in_reasoning": {"return": "bool"}},
    "ConversionOptions": {
        "default_thinking_mode": "bool",
        "model_versions_by_name": "dict[str, ModelVersion]",
        "thinking_max_tokens_upper_bound": "int",
        "non_thinking_max_tokens_upper_bound": "int",
        "reasoning_content_behavior": "ReasoningContentBehavior",
        "responses_web_search": "WebSearchBehavior",
        "messages_web_search": "WebSearchBehavior",
        "special_tokens": "SpecialTokens",
        "with_default_thinking_mode": {"return": "ConversionOptions"},
        "with_reasoning_content_behavior": {"return": "ConversionOptions"},
        "with_responses_web_search": {"return": "ConversionOptions"},
        "with_messages_web_search": {"return": "ConversionOptions"},
        "with_model_alias": {"return": "ConversionOptions"},
        "with_model_versions_by_name": {"return": "ConversionOptions"},
        "with_thinking_max_tokens_upper_bound": {"return": "ConversionOptions"},
        "with_non_thinking_max_tokens_upper_bound": {"return": "ConversionOptions"},
    },
    "OutputConstraint": {"kind": "str", "schema": "str"},
    "InferenceOptions": {
        "max_tokens": "int | None",
        "temperature": "float | None",
        "top_p": "float | None",
        "logprobs": "bool",
        "top_logprobs": "int | None",
        "seed": "int | None",
        "output_constraint": "OutputConstraint | None",
    },
    "ParsingOptions": {
        "parse_tool_calls": "bool",
        "starts_in_tool_calls": "bool",
        "parse_json_output": "bool",
        "thinking_initial_stage": "ThinkingInitialStage | None",
        "stop_sequences": ("list[str]", "Sequence[str]"),
        "special_tokens": "SpecialTokens",
    },
    "ConversationRequest": {
        "conversation": "Conversation",
        "inference_options": "InferenceOptions",
        "parsing_options": "ParsingOptions",
        "model_version": "ModelVersion",
        "stream": "bool",
        "resolve_max_tokens": {"return": "int"},
    },
    "ChatCompletionRequest": {
        **_REQUEST,
        "chunk_generator": {"return": "ChatCompletionChunkGenerator"},
    },
    "ResponsesRequest": {
        **_REQUEST,
        "namespace_tool_map": {
            "options": "ConversionOptions",
            "return": "dict[str, tuple[str, str]]",
        },
        "echo": {"return": "ResponsesEcho"},
        "chunk_generator": {"return": "ResponsesChunkGenerator"},
    },
    "MessagesRequest": {**_REQUEST, "chunk_generator": {"return": "MessagesChunkGenerator"}},
    # streaming output
    "PromptUsage": {"prompt_tokens": "int", "prompt_cache_hit_tokens": "int"},
    "InferenceChunk": {
        "ready": {"return": "InferenceChunk"},
        "text": {"return": "InferenceChunk"},
        "tokens": {"return": "InferenceChunk"},
        "finish": {"return": "InferenceChunk"},
        "kind": 'Literal["ready", "text", "tokens", "finish"]',
        "content": "str | None",
        "token_ids": "list[int] | None",
        "finish_reason": "InferenceFinishReason | None",
        "prompt_usage": "PromptUsage | None",
        "token_count": "int | None",
        "system_fingerprint": "str | None",
    },
    "ResponsesChunkGenerator": {
        "with_namespace_tool_map": {"return": "ResponsesChunkGenerator"},
        "with_echo": {"return": "ResponsesChunkGenerator"},
    },
    "ResponsesEcho": {
        "instructions": "str | None",
        "max_output_tokens": "int | None",
        "temperature": "float",
        "top_p": "float",
        "top_logprobs": "int",
        "user": "str | None",
    },
    "MessagesChunkGenerator": {"with_signature": {"return": "MessagesChunkGenerator"}},
    "StreamProcessor": {
        "__new__": {"options": "ParsingOptions"},
        "finished": "bool",
        "push": {"chunk": "InferenceChunk", "return": "list[_Event]"},
        "finish": {"return": "list[_Event]"},
        "close": {"return": "None"},
    },
    "ChatCompletionResponse": {
        **_RESPONSE,
        "accumulate": {"chunk": "ChatCompletionChunk", "return": "None"},
        "sse_event_name": {"chunk": "ChatCompletionChunk", "return": "str | None"},
    },
    "ResponsesResponse": {
        **_RESPONSE,
        "accumulate": {"chunk": "ResponsesStreamEvent", "return": "None"},
        "sse_event_name": {"chunk": "ResponsesStreamEvent", "return": "str | None"},
    },
    "MessagesResponse": {
        **_RESPONSE,
        "accumulate": {"chunk": "MessagesStreamEvent", "return": "None"},
        "sse_event_name": {"chunk": "MessagesStreamEvent", "return": "str | None"},
    },
}

# Dunder methods worth declaring (the rest are object's); "{cls}" is the class.
DUNDERS: dict[str, str] = {
    "__int__": "def __int__(self) -> int: ...",
    "__index__": "def __index__(self) -> int: ...",
    "__bool__": "def __bool__(self) -> bool: ...",
    "__len__": "def __len__(self) -> int: ...",
    "__eq__": "def __eq__(self, value: object, /) -> bool: ...",
    "__ne__": "def __ne__(self, value: object, /) -> bool: ...",
    "__lt__": "def __lt__(self, value: {cls}, /) -> bool: ...",
    "__le__": "def __le__(self, value: {cls}, /) -> bool: ...",
    "__gt__": "def __gt__(self, value: {cls}, /) -> bool: ...",
    "__ge__": "def __ge__(self, value: {cls}, /) -> bool: ...",
}
# Dunders left out: object's own (stubs inherit them) and what the stub declares otherwise.
SKIP_DUNDERS = {
    "__new__",
    "__init__",
    "__repr__",
    "__str__",
    "__doc__",
    "__module__",
    "__dict__",
    "__weakref__",
    "__hash__",
    "__getattribute__",
    "__setattr__",
    "__delattr__",
    "__reduce__",
    "__reduce_ex__",
    "__getstate__",
    "__setstate__",
    "__sizeof__",
    "__format__",
    "__dir__",
    "__init_subclass__",
    "__subclasshook__",
    "__text_signature__",
}

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

TYPING_NAMES = ("Any", "ClassVar", "Literal", "TypeAlias", "final")
ABC_NAMES = ("Callable", "Mapping", "Sequence")

# --- runtime introspection ---------------------------------------------------------------------


class Generator:
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.fallbacks: list[str] = []
        # Runtime class object -> the name the module exports it under (an exception's
        # `__name__` can differ from its exported name).
        self.exported: dict[int, str] = {
            id(v): k for k, v in vars(module).items() if isinstance(v, type) and _public(k)
        }

    # annotations

    def _spec(self, cls: str, member: str) -> Any:
        spec, shared = TYPES.get(cls, {}).get(member), TYPES["*"].get(member)
        if isinstance(spec, dict) and isinstance(shared, dict):
            return {**shared, **spec}
        return shared if spec is None else spec

    def _fallback(self, where: str) -> str:
        self.fallbacks.append(where)
        return "Any"

    def _param_type(self, spec: dict[str, str], cls: str, func: str, p: inspect.Parameter) -> str:
        ann = spec.get(p.name) or spec.get("*") or PARAMS.get(p.name)
        if ann is None:
            ann = self._fallback(f"{_label(cls, func)}({p.name})")
        ann = ann.replace("{cls}", cls)
        if p.default is None and ann != "Any" and "None" not in ann.split(" | "):
            ann += " | None"
        return ann

    # signatures

    def _signature(self, obj: Any) -> inspect.Signature | None:
        if getattr(obj, "__text_signature__", None) is None:
            return None
        try:
            return inspect.signature(obj)
        except (TypeError, ValueError):
            return None

    def _def(self, cls: str, name: str, obj: Any, kind: str, doc: str | None) -> list[str]:
        """One `def` from a text signature; kind: method, static, class, new or function."""
        target = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
        sig = self._signature(target)
        params = list(sig.parameters.values()) if sig else []
        spec = self._spec(cls, name) if kind != "function" else TYPES.get("", {}).get(name)
        spec = spec if isinstance(spec, dict) else {}
        if kind in ("method", "class") and params:
            params = params[1:]  # $self / $cls
        if sig is None:
            first = {"method": "self, ", "class": "cls, ", "new": "cls, "}.get(kind, "")
            args = f"{first}*args: Any, **kwargs: Any"
            self._fallback(f"{_label(cls, name)}(...)")
        else:
            args = self._params(spec, cls, name, params, kind)
        ret = spec.get("return")
        if ret is None:
            ret = cls if kind == "new" else self._fallback(f"{_label(cls, name)} return")
        ret = ret.replace("{cls}", cls)
        deco = {"static": ["@staticmethod"], "class": ["@classmethod"]}.get(kind, [])
        line = f"def {name}({args}) -> {ret}:"
        return [*deco, *([line, *_indent(_docstring(doc))] if doc else [line + " ..."])]

    def _params(
        self, spec: dict[str, str], cls: str, func: str, params: list[inspect.Parameter], kind: str
    ) -> str:
        out: list[str] = {"method": ["self"], "class": ["cls"], "new": ["cls"]}.get(kind, [])
        P = inspect.Parameter
        star = slash = False
        for i, p in enumerate(params):
            if p.kind is P.POSITIONAL_ONLY:
                slash = True
            elif slash:
                out.append("/")
                slash = False
            if p.kind is P.KEYWORD_ONLY and not star:
                out.append("*")
                star = True
            ann = self._param_type(spec, cls, func, p)
            if p.kind is P.VAR_POSITIONAL:
                out.append(f"*{p.name}: {ann}")
                star = True
            elif p.kind is P.VAR_KEYWORD:
                out.append(f"**{p.name}: {ann}")
            else:
                default = "" if p.default is P.empty else f" = {_default(p.default)}"
                out.append(f"{p.name}: {ann}{default}")
            if slash and i == len(params) - 1:
                out.append("/")
        return ", ".join(out)

    # classes

    def _class(self, name: str, cls: type) -> list[str]:
        bases = [self._base(b) for b in cls.__bases__ if b is not object]
        head = f"class {name}({', '.join(bases)}):" if bases else f"class {name}:"
        if not cls.__flags__ & (1 << 10):  # no Py_TPFLAGS_BASETYPE
            lines = ["@final", head]
        elif _is_disjoint_base(cls):
            lines = ["@disjoint_base", head]
        else:
            lines = [head]
        body: list[str] = []
        doc = _doc(cls) or DOCS.get(name)
        if doc:
            body += [*_docstring(doc), ""]
        own = vars(cls)
        members: list[str] = []
        props: list[tuple[str, Any]] = []
        for key, value in own.items():
            if isinstance(value, cls):  # enum-like member
                members.append(f"{key}: {name}")
            elif _is_property(value) and key not in SKIP_DUNDERS:
                props.append((key, value))
            elif key.startswith("__") and key.endswith("__"):
                continue
            elif not callable(value) and not isinstance(value, (staticmethod, classmethod)):
                spec = self._spec(name, key)
                ann = spec if isinstance(spec, str) else _value_type(value)
                members.append(f"{key}: {ann or self._fallback(f'{name}.{key}')}")
        body += members
        if own.get("__hash__", 0) is None:
            body.append("__hash__: ClassVar[None]  # type: ignore[assignment]")
        if "__new__" in own:
            body += self._def(name, "__new__", cls, "new", DOCS.get(f"{name}.__new__"))
        order = list(TYPES.get(name, {}))
        props.sort(key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
        for key, value in props:
            body += self._property(name, key, value)
        for key, value in own.items():
            if key.startswith("__") and key.endswith("__"):
                if key in DUNDERS:
                    body.append(DUNDERS[key].replace("{cls}", name))
                elif key not in SKIP_DUNDERS and callable(value) and not isinstance(value, cls):
                    body += self._def(name, key, value, "method", None)
                continue
            doc = _doc(value) or DOCS.get(f"{name}.{key}")
            if isinstance(value, staticmethod):
                body += self._def(name, key, value, "static", doc)
            elif isinstance(value, (classmethod, types.ClassMethodDescriptorType)):
                body += self._def(name, key, value, "class", doc)
            elif callable(value) and not isinstance(value, (type, cls)):
                body += self._def(name, key, value, "method", doc)
        while body and not body[-1]:
            body.pop()
        return lines + _indent(body or ["..."])

    def _property(self, cls: str, key: str, value: Any) -> list[str]:
        spec = self._spec(cls, key)
        get, put = (spec, spec) if isinstance(spec, str) else (spec or (None, None))
        if get is None:
            get = put = self._fallback(f"{cls}.{key}")
        doc = _doc(value) or DOCS.get(f"{cls}.{key}")
        line = f"def {key}(self) -> {get}:"
        out = ["@property", *([line, *_indent(_docstring(doc))] if doc else [line + " ..."])]
        if _is_writable(value):
            out += [f"@{key}.setter", f"def {key}(self, value: {put}) -> None: ..."]
        return out

    def _base(self, base: type) -> str:
        if id(base) in self.exported:
            return self.exported[id(base)]
        if base.__module__ == "builtins":
            return base.__qualname__
        raise SystemExit(f"gen_stub: base {base!r} is neither exported nor a builtin")

    # module

    def generate(self) -> str:
        m = self.module
        names = list(getattr(m, "__all__", None) or sorted(n for n in vars(m) if _public(n)))
        names += [n for n in vars(m) if _public(n) and n not in names]
        consts: list[str] = []
        body: list[str] = []
        classes: list[str] = []
        for name in names:
            value = getattr(m, name)
            if isinstance(value, type):
                classes.append(name)
            elif callable(value):
                doc = _doc(value)
                body.append("")
                body += self._def("", name, value, "function", doc)
            else:
                spec = TYPES.get("", {}).get(name)
                ann = spec or _value_type(value) or self._fallback(name)
                consts.append(f"{name}: {ann}")
        for name in classes:
            body.append("")
            body += self._class(name, getattr(m, name))
        body = consts + body
        text = "\n".join(body)
        aliases = _used_aliases(text)
        alias_lines = [f"{k}: TypeAlias = {ALIASES[k]}" for k in aliases]
        used_text = text + "\n".join(alias_lines)
        header = [
            f"# Generated from the built {MODULE} by tools/gen_stub.py: do not edit by hand;",
            "# annotations come from the tables in that script. Regenerate with `./dev stub`.",
            "",
        ]
        abc = [n for n in ABC_NAMES if re.search(rf"\b{n}\b", used_text)]
        typing = [n for n in TYPING_NAMES if re.search(rf"\b{n}\b", used_text)]
        if abc:
            header.append(f"from collections.abc import {', '.join(abc)}")
        if typing:
            header.append(f"from typing import {', '.join(typing)}")
        if "@disjoint_base" in text:
            header += ["", "from typing_extensions import disjoint_base"]
        if hasattr(m, "__all__"):
            header += ["", "__all__ = ["]
            header += [f'    "{n}",' for n in sorted(m.__all__, key=_all_key)]
            header.append("]")
        if alias_lines:
            header += ["", *alias_lines]
        return "\n".join([*header, "", *body, ""])


# --- helpers -----------------------------------------------------------------------------------


def _label(cls: str, member: str) -> str:
    return f"{cls}.{member}" if cls else member


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__version__"


def _doc(obj: Any) -> str | None:
    doc = obj.__doc__ if not isinstance(obj, (staticmethod, classmethod)) else obj.__func__.__doc__
    if isinstance(obj, (int, str, float, bool)) or not doc:
        return None
    return inspect.cleandoc(doc)


def _docstring(doc: str) -> list[str]:
    doc = doc.replace("\\", "\\\\").replace('"""', r"\"\"\"")
    lines = (doc + " " if doc.endswith('"') else doc).split("\n")
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return lines


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else "" for line in lines]


def _default(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str) and len(value) < 40 and value.isprintable():
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "..."


def _value_type(value: Any) -> str | None:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" and t is not type(None) else None


def _is_property(value: Any) -> bool:
    return isinstance(value, property) or inspect.isgetsetdescriptor(value)


def _is_writable(desc: Any) -> bool:
    """Whether a property or getset descriptor has a setter."""
    if isinstance(desc, property):
        return desc.fset is not None
    # CPython: PyGetSetDescrObject is {PyObject_HEAD; d_type; d_name; d_qualname; d_getset}, and
    # PyGetSetDef is {name; get; set; doc; closure}. Cross-check d_name before trusting it.
    ptr = ctypes.sizeof(ctypes.c_void_p)
    base = id(desc) + object.__basicsize__
    name = ctypes.c_void_p.from_address(base + ptr).value
    if name != id(desc.__name__):
        raise SystemExit(f"gen_stub: unexpected getset descriptor layout ({desc!r})")
    getset = ctypes.c_void_p.from_address(base + 3 * ptr).value
    return bool(getset) and ctypes.c_void_p.from_address(getset + 2 * ptr).value is not None


def _is_disjoint_base(cls: type) -> bool:
    """PEP 800: the instance layout differs from the base's (CPython's shape_differs(), as
    mypy.stubtest mirrors it), so the class cannot share a subclass with another such base."""
    base = cls.__base__
    if base is None:
        return True
    if sys.version_info >= (3, 12) or cls.__itemsize__ or base.__itemsize__:
        return cls.__basicsize__ != base.__basicsize__ or cls.__itemsize__ != base.__itemsize__
    size, word = cls.__basicsize__, ctypes.sizeof(ctypes.c_void_p)
    if not base.__weakrefoffset__ and cls.__weakrefoffset__ + word == size:
        size -= word
    if not base.__dictoffset__ and cls.__dictoffset__ + word == size:
        size -= word
    return size != base.__basicsize__


def _used_aliases(text: str) -> list[str]:
    used: list[str] = []
    pending = [k for k in ALIASES if re.search(rf"\b{k}\b", text)]
    while pending:
        k = pending.pop(0)
        if k in used:
            continue
        used.append(k)
        pending += [a for a in ALIASES if re.search(rf"\b{a}\b", ALIASES[k]) and a not in used]
    return [k for k in ALIASES if k in used]


def _all_key(name: str) -> tuple[int, list[Any]]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest; digits naturally."""
    group = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
    return group, parts


def _ruff_format(text: str) -> str:
    cmd = [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(STUB), "-"]
    try:
        done = subprocess.run(cmd, input=text, capture_output=True, text=True, cwd=ROOT)
    except OSError as e:
        msg = f"gen_stub: cannot run ruff ({e}); pip install -r requirements/dev.txt"
        raise SystemExit(msg) from e
    if done.returncode != 0:
        sys.stderr.write(text)
        raise SystemExit(f"gen_stub: ruff format failed:\n{done.stderr}")
    return done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail if the committed stub is stale")
    mode.add_argument("--stdout", action="store_true", help="print the stub, write nothing")
    args = ap.parse_args()

    gen = Generator(importlib.import_module(MODULE))
    text = _ruff_format(gen.generate())
    if gen.fallbacks:
        print(
            f"gen_stub: {len(gen.fallbacks)} annotation(s) not in the tables, typed Any: "
            + ", ".join(gen.fallbacks),
            file=sys.stderr,
        )
    rel = STUB.relative_to(ROOT)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    current = STUB.read_text() if STUB.exists() else ""
    if args.check:
        if current == text:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"{rel} (current)",
            f"{rel} (generated from the built module)",
        )
        sys.stderr.writelines(diff)
        print(
            f"gen_stub: {rel} is stale; regenerate it with `./dev stub` "
            "(python tools/gen_stub.py) and commit the result",
            file=sys.stderr,
        )
        return 1
    if current == text:
        print(f"gen_stub: {rel} is up to date", file=sys.stderr)
    else:
        STUB.write_text(text)
        print(f"gen_stub: wrote {rel}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
