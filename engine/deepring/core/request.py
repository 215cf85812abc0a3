"""A request's state inside a worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from deepring.sampling.params import SamplingParams, TokenLogprob
from deepring.structured.constraint import Constraint


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    output_ids: list[int] = field(default_factory=list)
    num_cached: int = 0  # leading tokens whose cache entries are written
    slot: int | None = None
    blocks: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    num_preemptions: int = 0
    # Prefix cache (core.prefix). The TTL class of this request's blocks: "chat" | "agent".
    cache_class: str = "chat"
    cache_hit: int = 0  # prompt tokens whose KV came from the cache
    compress_from: int = 0  # positions below: compressed state cached (SeqChunk.compress_from)
    window_floor: int = 0  # replay: the first position whose window key exists
    snapshot_at: int | None = None  # prompt prefill stops here once for a ring snapshot
    block_keys: list[bytes] = field(default_factory=list)  # hash chain of its full blocks
    published: int = 0  # leading blocks published in the device index
    stored: int = 0  # leading blocks known to be in the persistent store
    fetch: Any = None  # the store read-ahead in flight (a Future)
    fetched: dict[bytes, bytes] | None = None  # its result, until admission
    ring_pending: tuple[bytes, bytes] | None = None  # latest output ring snapshot
    # Structured output: the constraint (travels with the request) and its matcher here
    # (structured.runtime.GrammarState, consumed every output token so far).
    constraint: Constraint | None = None
    grammar: Any = None
    # Whether the output holds the end of thinking (SamplingParams.thinking_budget's count).
    thinking_ended: bool = False
    # The log probabilities of the token the runner sampled this step, when params.logprobs
    # asks for them (EngineCore.step takes them into the StepResult).
    new_logprob: TokenLogprob | None = None
    # Speculative decoding (core.speculative): tokens a drafter proposes to follow the last
    # one (the next step verifies them), the drafter's calibrated prefix survival for each
    # (None: it has no confidence head), and the first position whose drafter context this
    # slot holds (None: none yet).
    drafts: list[int] = field(default_factory=list)
    survival: list[float] | None = None
    draft_from: int | None = None
    # V4.1 images (core.images): their spans' (start, end) in the prompt, the prompt as the
    # prefix cache keys it (None: the prompt itself), and the span embeddings computed for
    # chunks still to come (image index -> [span length, hidden]; dropped once prefilled).
    images: tuple = ()
    image_spans: list[tuple[int, int]] = field(default_factory=list)
    key_prompt: list[int] | None = None
    image_embeds: dict = field(default_factory=dict)
    # The overlapped engine (core.overlap): whether a launched step holding this request is
    # still computing (its slot and blocks are freed only once it is not), and the tokens that
    # step will add to its output (0 or 1: the next step is planned before they are known).
    in_flight: bool = False
    ahead: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token(self, i: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens start..end-1 of prompt + output, without joining the two lists (a decode step
        asks each request for its last token)."""
        return self._span(self.prompt_ids, start, end)

    def key_tokens(self, start: int, end: int) -> list[int]:
        """tokens(start, end) as the prefix cache keys them (core.images.key_ids)."""
        return self._span(self.prompt_ids if self.key_prompt is None else self.key_prompt,
                          start, end)  # fmt: skip

    def _span(self, prompt: list[int], start: int, end: int) -> list[int]:
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return prompt[start:] + self.output_ids[: end - n]

    @property
    def pending(self) -> int:
        """Tokens not yet fed to the model (the whole prompt at first, then 1 per decode),
        counting the one a computing step will add (`ahead`)."""
        return self.num_tokens + self.ahead - self.num_cached

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
