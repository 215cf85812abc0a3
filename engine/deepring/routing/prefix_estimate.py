"""The frontend's estimate of how much of a prompt the prefix cache will serve, for routing.

Every prefill worker reads the same persistent tiers, so a prompt's hit does not depend on the
worker it goes to: the router only needs how many of its tokens will actually be computed (the
prefill cost). The frontend remembers the block chains of the prompts it routed (a bounded LRU
of digests of full blocks) and counts the longest remembered prefix as cached. It is an
estimate: the workers' tiers may have evicted or expired a block the frontend still remembers,
or hold blocks from other frontends or from generated output; the workers report the true hit
with each request's first token.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from deepring.token_ids import u4_bytes


class PrefixEstimate:
    def __init__(self, block_size: int = 128, capacity: int = 1 << 18) -> None:
        if block_size < 1 or capacity < 1:
            raise ValueError("block_size and capacity must be >= 1")
        self.block_size = block_size
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def chain(self, prompt_ids) -> list[bytes]:
        """The digests of the prompt's full blocks that a hit may cover, first to last."""
        bs = self.block_size
        n = (len(prompt_ids) - 1) // bs  # a hit always leaves a token to compute
        if n <= 0:
            return []
        data = u4_bytes(prompt_ids[: n * bs])
        size, blake2b = 4 * bs, hashlib.blake2b
        out, parent = [], b""
        for start in range(0, n * size, size):
            parent = blake2b(parent + data[start : start + size], digest_size=16).digest()
            out.append(parent)
        return out

    def cached_tokens(self, prompt_ids) -> int:
        """Tokens of the prompt's longest remembered prefix of full blocks; the prompt's blocks
        are remembered from now on."""
        chain = self.chain(prompt_ids)
        hit = 0
        for key in chain:
            if key not in self._seen:
                break
            hit += 1
        for key in chain:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return hit * self.block_size
