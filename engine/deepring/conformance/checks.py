"""One example against a live server: the requests it sends and the properties it checks.

A generated body that deepring_recipe cannot convert is sent as it is and must be refused.
One it converts is sent twice, made deterministic (temperature 0, a seed) and capped at a few
tokens: streamed and not; both answers are checked on their own and against each other, and
the same body naming an unknown model must be refused. The fixed checks (a prompt beyond the
context, a repeated long prompt) run once per protocol.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepring.conformance import outputs, variants
from deepring.conformance.oracle import Oracle
from deepring.conformance.properties import Verdicts
from deepring.conformance.properties import errors as perrors
from deepring.conformance.properties import outputs as poutputs
from deepring.conformance.properties import streams as pstreams
from deepring.conformance.properties import usage as pusage
from deepring.conformance.wire import Client, Exchange

UNKNOWN_MODEL = "no-such-model:deepring-conformance"
# The repeated prompt of the prefix-cache check: longer than OpenAI's 1024-token caching floor
# and many cache blocks of any server, where the context allows.
CACHE_PROMPT_TOKENS = 1200


@dataclass
class Target:
    """The server under test and how to talk to it."""

    base_url: str
    api_key: str | None = None
    model: str | None = None  # None: the first of GET /v1/models
    max_tokens: int = 8  # output cap of generated requests (the run's speed)
    seed: int | None = 0  # the seed field of deterministic requests (None: not sent)
    tokenizer: Path | None = None  # the served model's tokenizer.json: prompt counts checked
    template: str | None = None  # v4 | v41 (None: either)
    context_length: int | None = None  # None: GET /v1/models' max_model_len, if it says
    prefix_cache: str = "auto"  # on | off | auto (claimed when usage reports cached tokens)
    default_thinking: bool | None = None  # the server's, probed by runner.discover
    timeout: float = 120.0


class Gate:
    """Shared by the run's threads: requests go through `shared()`; `alone()` waits until
    none is in flight and holds the others back, so the server sees that request only (where
    the run is its only client)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._alone = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._alone)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._alone)
            self._alone = True
            self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


class Checker:
    """Checks examples of one protocol (one per thread: it owns an HTTP connection)."""

    def __init__(self, target: Target, protocol: str, oracle: Oracle, gate: Gate) -> None:
        if target.model is None:
            raise ValueError("no model to request: runner.discover names it")
        self.model: str = target.model
        self.t = target
        self.protocol = protocol
        self.oracle = oracle
        self.gate = gate
        self.client = Client(target.base_url, target.api_key, target.timeout)
        # pairs that differed next to the run's other requests and agreed when sent alone
        self.load_dependent = 0

    def close(self) -> None:
        self.client.close()

    def _send(self, v: Verdicts, body: Any) -> Exchange:
        v.request = body
        with self.gate.shared():
            return self.client.post(self.protocol, body)

    def example(self, body: Any, max_tokens: int | None = None) -> Verdicts:
        """body: a generated request body (dict, str or bytes); max_tokens: its output cap
        (default: the target's)."""
        v = Verdicts()
        p = self.protocol
        body = variants.point_at(body, self.model)
        if not self.oracle.valid(p, body):
            ex = self._send(v, body)
            perrors.check_refused(v, "invalid_refused", ex, "a body deepring_recipe refuses")
            perrors.check_error(v, ex, "an invalid body")
            return v
        plain_body = variants.as_dict(body)
        if plain_body is None:  # a valid body is a JSON object, but stay safe
            return v
        cap = max_tokens or self.t.max_tokens
        # the twins differ in streaming only: one prompt, one expectation
        greedy, counts = self.oracle.expect(
            p, variants.twin(p, plain_body, False, cap, self.t.seed)
        )
        streamed = self._twin(v, plain_body, True, cap, counts)
        plain = self._twin(v, plain_body, False, cap, counts)
        v.request = streamed.body
        first = Verdicts(request=streamed.body)
        pstreams.check_agreement(first, streamed, plain, greedy)
        if first.failed:
            # A server's output may depend on what it batches with a request (few forward
            # passes are batch-invariant): answers that differ next to the run's other
            # requests are asked again alone, and only a difference there fails.
            with self.gate.alone():
                streamed = self.client.post(p, streamed.body)
                plain = self.client.post(p, plain.body)
            again = Verdicts(request=streamed.body)
            pstreams.check_agreement(again, streamed, plain, greedy)
            self.load_dependent += not again.failed
            first = again
        v.merge(first)
        unknown = {**plain.body, "model": UNKNOWN_MODEL}
        ex = self._send(v, unknown)
        perrors.check_refused(v, "unknown_model", ex, f"model {UNKNOWN_MODEL!r}")
        return v

    def _twin(
        self, v: Verdicts, body: dict, stream: bool, cap: int, counts: set[int] | None
    ) -> Exchange:
        """Send the body's deterministic twin and check the answer on its own; counts: the
        prompt lengths deepring_recipe expects."""
        p = self.protocol
        twin = variants.twin(p, body, stream, cap, self.t.seed)
        ex = self._send(v, twin)
        where = "streamed" if stream else "non-streamed"
        if not ex.ok:
            perrors.check_error(v, ex, where)
            return ex
        if stream:
            pstreams.check_framing(v, ex)
            pstreams.check_order(v, ex)
            out = outputs.from_stream(p, ex.events)
        else:
            out = outputs.from_body(p, ex.json)
        pusage.check_arithmetic(v, out.usage, where, twin[variants.MAX_TOKEN_FIELDS[p][0]])
        pusage.check_prompt_count(v, out.usage, counts, where)
        declared = variants.tool_names(p, twin)
        poutputs.check_tool_calls(v, out, declared, where)
        poutputs.check_markup(v, out, where)
        # a tool choice without tools is ignored (deepring_recipe converts it so, as does the
        # official library): nothing to honour
        forced = variants.forced_tool(p, twin) if declared else None
        poutputs.check_tool_choice(v, out, forced, where)
        poutputs.check_schema(v, out, variants.json_schema(p, twin), where)
        return ex

    # ---- the fixed checks ------------------------------------------------------------------

    def oversize(self, context: int) -> Verdicts:
        """A prompt of more tokens than the context holds ("hello " is at least one token)."""
        v = Verdicts()
        words = context + 16
        body = variants.text_body(self.protocol, self.model, "hello " * words, 16)
        with self.gate.shared():
            ex = self.client.post(self.protocol, body)
        # what a failure shows: the body in short
        short = variants.text_body(self.protocol, self.model, f"hello x {words}", 16)
        v.request = f"{json.dumps(short)} (the text: 'hello ' {words} times)"
        perrors.check_refused(
            v, "oversize_prompt", ex, f"a prompt beyond the {context}-token context"
        )
        return v

    def cache(self, context: int | None) -> Verdicts:
        """The same long prompt twice (a fresh nonce first, so the first is a miss)."""
        v = Verdicts()
        words = CACHE_PROMPT_TOKENS if context is None else min(CACHE_PROMPT_TOKENS, context // 2)
        text = f"{secrets.token_hex(8)} " + " ".join(f"item {i % 97}" for i in range(words // 2))
        body = variants.twin(
            self.protocol,
            variants.text_body(self.protocol, self.model, text, 1),
            False,
            1,
            self.t.seed,
        )
        first = self._send(v, body)
        second = self._send(v, body)
        for ex in (first, second):
            if not ex.ok:
                perrors.check_error(v, ex, "a long prompt")
                return v
        u1 = outputs.from_body(self.protocol, first.json).usage
        u2 = outputs.from_body(self.protocol, second.json).usage
        pusage.check_cache_hit(v, u1, u2, self.t.prefix_cache == "on")
        return v
