"""Zero-cost model mode: tokens without compute, to measure the serving stack alone.

The runner keeps the ModelRunner contract (feed each scheduled chunk, return a token for every
chunk that completes its request's known tokens) but never touches a model or a cache: the token
at position p of a request with seed s is a fixed function of (s, p), drawn from ordinary text so
that the protocol layer decodes and parses it like real output. EOS is never produced; requests
end at max_tokens (or when aborted). A thinking budget ends the reasoning as with a model.
Penalties do not apply; a request that asks for log
probabilities gets 0 (certain) for each token. Scheduling, block accounting, handoffs and the
rings all run as they do with a real model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from deepring.core.scheduler import Scheduled, advance

_TEXT = (
    "The quick brown fox jumps over the lazy dog while the serving stack streams every token "
    "through prefill, handoff and decode, and the frontend turns them into protocol events. "
)


def text_token_ids(tokenizer_file: Path | None) -> list[int]:
    """Token ids of an ordinary English passage (or a plain id range without a tokenizer)."""
    if tokenizer_file is not None and tokenizer_file.is_file():
        import deepring_recipe

        ids = deepring_recipe.Tokenizer.from_file(str(tokenizer_file)).encode(_TEXT * 4)
        if ids:
            return list(ids)
    return list(range(1000, 1256))


class ZeroCostRunner:
    def __init__(self, token_ids: list[int], step_seconds: float = 0.0) -> None:
        if not token_ids:
            raise ValueError("the zero-cost runner needs at least one token id")
        self.token_ids = token_ids
        self.pool = None  # no cache tensors: handoffs carry empty records
        self.step_seconds = step_seconds  # a paced step sleeps (it does not burn CPU)

    def token_at(self, seed: int, position: int) -> int:
        ids = self.token_ids
        return ids[(seed + position) % len(ids)]

    def step(self, scheduled: list[Scheduled]) -> list[int | None]:
        return self.launch(scheduled)()

    def prepare(self, scheduled: list[Scheduled]) -> list[bool]:
        """Which chunks sample (core.overlap asks while the step before computes)."""
        return [s.completes for s in scheduled]

    def launch(
        self, scheduled: list[Scheduled], prepared: list[bool] | None = None
    ) -> Callable[[], list[int | None]]:
        """step() started (num_cached advanced): the returned function waits for the tokens.
        A paced step is a device computing for step_seconds from now, whatever the host does
        meanwhile: the wait makes the tokens (the device's sampler), then sleeps out the rest
        of the step (no thread: a handover of the GIL costs more than the work it hides)."""
        completes = prepared if prepared is not None else self.prepare(scheduled)
        advance(scheduled)
        done_at = time.perf_counter() + self.step_seconds

        def wait() -> list[int | None]:
            tokens = self._tokens(scheduled, completes)
            left = done_at - time.perf_counter()
            if left > 0:
                time.sleep(left)
            return tokens

        return wait

    def _tokens(self, scheduled: list[Scheduled], completes: list[bool]) -> list[int | None]:
        out: list[int | None] = []
        for s, c in zip(scheduled, completes, strict=True):
            if not c:
                out.append(None)
                continue
            r = s.request
            forced = r.params.forced_think_end(len(r.output_ids), r.thinking_ended)
            tok = self.token_at(r.seed, r.num_tokens) if forced is None else forced
            k = r.params.logprobs
            if k is not None:
                # A canned token is certain: log probability 0, and no alternative.
                r.new_logprob = (0.0, [(tok, 0.0)][:k])
            out.append(tok)
        return out
