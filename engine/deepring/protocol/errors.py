"""Error bodies: OpenAI's shape on the OpenAI routes, Anthropic's on /v1/messages.

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"}}

deepseek-recipe 0.2.0 reports conversion errors in the OpenAI shape for every protocol; on
/v1/messages the frontend re-wraps them in Anthropic's shape (a deliberate deviation).
"""

from __future__ import annotations

import json

_OPENAI_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "request_too_large"),
    414: ("invalid_request_error", "uri_too_long"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    431: ("invalid_request_error", "request_headers_too_large"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
    505: ("invalid_request_error", "http_version_not_supported"),
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    414: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "api_error",
    503: "overloaded_error",
    505: "invalid_request_error",
}


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def openai_error(status: int, message: str, code: str | None = None) -> dict:
    kind, default_code = _OPENAI_TYPES.get(status, ("server_error", None))
    return {
        "error": {
            "message": message,
            "type": kind,
            "param": None,
            "code": code if code is not None else default_code,
        }
    }


def anthropic_error(status: int, message: str) -> dict:
    return {
        "type": "error",
        "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message},
    }


def error_body(path: str, status: int, message: str) -> bytes:
    """The JSON error body for a request to `path`."""
    body = anthropic_error(status, message) if is_anthropic(path) else openai_error(status, message)
    return json.dumps(body, ensure_ascii=False).encode()


class ApiError(Exception):
    """An error answered with an HTTP status; `openai_body` keeps a ready-made OpenAI body
    (the protocol library's own, for conversion errors)."""

    def __init__(
        self,
        status: int,
        message: str,
        openai_body: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.openai_body = openai_body
        self.headers = headers or []

    def body(self, path: str) -> bytes:
        if self.openai_body is not None and not is_anthropic(path):
            return self.openai_body.encode()
        return error_body(path, self.status, self.message)


def field_error(param: str, message: str, code: str = "invalid_request_error") -> ApiError:
    """A 400 about one request field: OpenAI's `param` names it (and `code` says what is wrong);
    on /v1/messages the message alone, in Anthropic's shape, which names the field itself."""
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }
    return ApiError(400, message, openai_body=json.dumps(body, ensure_ascii=False))
