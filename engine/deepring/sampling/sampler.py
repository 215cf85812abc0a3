"""Deterministic, batch-invariant sampling.

Every random number is a function of (request seed, position of the token being sampled) only:
u = SplitMix64(SplitMix64(seed) XOR position) mapped to [0, 1). The sampling kernel treats each
row on its own, so a request samples the same tokens whatever else is in the batch and in
whatever order, as long as its logits are the same.
"""

from __future__ import annotations

import torch

from deepring.kernels.sampling import sample
from deepring.sampling.params import SamplingParams

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) with 53 random bits, from (seed, position)."""
    return (splitmix64(splitmix64(seed & _MASK) ^ (position & _MASK)) >> 11) * 2.0**-53


class Sampler:
    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        seeds: list[int],
        positions: list[int],
    ) -> list[int]:
        """Sample one token per row; row i is the request with params[i] and seeds[i], and the
        token lands at positions[i]."""
        b = logits.shape[0]
        if not (len(params) == len(seeds) == len(positions) == b):
            raise ValueError("one params/seed/position per logits row")
        if all(p.greedy for p in params):
            # max(-1).indices: the first maximum like argmax, but several times faster on CPU.
            return logits.max(-1).indices.tolist()
        dev = logits.device
        temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
        top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev)
        u = torch.tensor(
            [uniform(s, pos) for s, pos in zip(seeds, positions, strict=True)],
            dtype=torch.float64,
            device=dev,
        )
        return sample(logits, temp, top_p, top_k, u).tolist()
