"""What stands in for the model and the persistent cache tier in a simulated worker.

`SimRunner` keeps the Runner contract of core.runner (feed each chunk, return a token for every
chunk that completes its request's known tokens) without a model: a step takes the time its
step-time model predicts (times a seeded noise factor), on the worker's own clock, which the
engine reads to time its steps and the pacer reads for deadlines. Tokens are a fixed function
of (seed, position), as in the zero-cost runner; requests end at max_tokens.

`SharedBlocks` is the persistent tier every prefill worker reads (DeepRing's directory or
Redis store): the hash chains of the full blocks written so far. `SimPrefix` is the scheduler's
prefix-cache hook (core.scheduler calls ready / acquire / release): a request admitted on a
worker starts after its longest chain of written blocks, at least one token short of its end.

A chain is PrefixEstimate.chain's digests (each block's digest covers its parent's), so the
chain of a conversation's next prompt starts with the chain of the previous prompt and answer:
the cluster keeps each request's chain and hashes only the blocks a turn adds
(`SharedBlocks.extend`), where hashing every prompt from its start again cost more than the
rest of a prefill.
"""

from __future__ import annotations

import hashlib
import random
import weakref

import numpy as np

from deepring.core.scheduler import Scheduled
from deepring.cost.model import StepCost, StepShape
from deepring.routing.prefix_estimate import PrefixEstimate

# SimRunner.token_at depends on (seed + position) modulo this only (sim.batch reads the tokens
# of steady steps off one cycle of them).
PERIOD = 1000


class WorkerClock:
    """A worker's own time: set to the event's time when it wakes, advanced by its steps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimRunner:
    def __init__(
        self, truth: StepCost, clock: WorkerClock, noise: float = 0.0, seed: int = 0
    ) -> None:
        if noise < 0:
            raise ValueError("noise must be >= 0")
        self.truth = truth
        self.clock = clock
        self.noise = noise
        self.rng = random.Random(seed)
        self.pool = None  # no cache tensors: handoffs carry empty records
        self.last = (StepShape(), 0.0)  # the last step: its shape and simulated seconds
        self.last_decodes = 0  # its chunks of one token
        # A decode worker's running batch as sim.fastforward last saw it (sim.batch.Batch);
        # incremental False: it is read again from the requests at every step (for checking).
        self.batch = None
        self.incremental = True

    def duration(self, shape: StepShape) -> float:
        """Seconds a step of this shape takes (one noise draw per step)."""
        seconds = self.truth.predict(shape)
        if self.noise:
            seconds *= max(0.1, self.rng.gauss(1.0, self.noise))
        return seconds

    @staticmethod
    def token_at(seed: int, position: int) -> int:
        """The token sampled at `position` (the request's length before it)."""
        return 1000 + (seed + position) % PERIOD

    def step(self, scheduled: list[Scheduled]) -> list[int | None]:
        shape = StepShape.of((s.num_tokens, s.request.num_cached) for s in scheduled)
        seconds = self.duration(shape)
        self.clock.now += seconds
        self.last = (shape, seconds)
        self.last_decodes = sum(1 for s in scheduled if s.num_tokens == 1)
        out: list[int | None] = []
        for s in scheduled:
            r = s.request
            completes = s.completes
            r.num_cached += s.num_tokens
            out.append(self.token_at(r.seed, r.num_tokens) if completes else None)
        return out


class SharedBlocks:
    """Chains of the full blocks written to the shared tier (no expiry: a trace is minutes)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._chains = PrefixEstimate(block_size)
        self.keys: set[bytes] = set()

    def write(self, token_ids) -> None:
        """The full blocks of these tokens are written (a prompt prefilled, an answer done)."""
        # + 0: the last block counts too (an array: unpacking one into a list costs more than
        # hashing it).
        self.keys.update(self._chains.chain(np.append(np.asarray(token_ids), 0)))

    def chain(self, token_ids) -> list[bytes]:
        """The keys of the blocks a request of these tokens may start after."""
        return self._chains.chain(token_ids)

    def extend(self, chain: list[bytes], token_ids: np.ndarray, blocks: int) -> list[bytes]:
        """The digests of the first `blocks` full blocks of token_ids, given `chain`, those of
        its first len(chain) blocks (PrefixEstimate.chain's, continued from the last)."""
        if blocks <= len(chain):
            return chain[:blocks]
        bs, size = self.block_size, 4 * self.block_size
        # PrefixEstimate.chain's bytes (token_ids.u4_bytes of an array) and digests.
        data = np.asarray(token_ids[len(chain) * bs : blocks * bs], dtype="<u4").tobytes()
        out, parent, blake2b = list(chain), chain[-1] if chain else b"", hashlib.blake2b
        for start in range(0, len(data), size):
            parent = blake2b(parent + data[start : start + size], digest_size=16).digest()
            out.append(parent)
        return out

    def add(self, chain: list[bytes]) -> None:
        """write() of tokens whose full blocks have these digests (extend's)."""
        self.keys.update(chain)

    def hit(self, chain: list[bytes]) -> int:
        """Tokens of the longest written prefix of a request with this chain."""
        n = 0
        for key in chain:
            if key not in self.keys:
                break
            n += 1
        return n * self.block_size


class SimPrefix:
    def __init__(self, shared: SharedBlocks) -> None:
        self.shared = shared
        self._chains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def ready(self, req) -> bool:
        return True  # the store read is not simulated

    def hint(self, req, chain: list[bytes]) -> None:
        """req's chain (shared.chain of its tokens), known to the cluster already."""
        self._chains[req] = chain

    def expected_hit(self, req) -> int:
        chain = self._chains.get(req)
        if chain is None:  # hashing a long prompt is the costly part: once per request
            chain = self._chains[req] = self.shared.chain(req.tokens(0, req.num_tokens))
        return self.shared.hit(chain)

    def acquire(self, req, slot: int) -> None:
        req.num_cached = req.cache_hit = self.expected_hit(req)

    def release(self, req) -> None:
        req.num_cached = req.cache_hit = 0
