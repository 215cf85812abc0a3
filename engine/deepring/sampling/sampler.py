"""Deterministic, batch-invariant sampling.

Every random number is a function of (request seed, position of the token being sampled) only:
u = SplitMix64(SplitMix64(seed) XOR position) mapped to [0, 1). Every step below treats each
row on its own, so a request samples the same tokens whatever else is in the batch and in
whatever order, as long as its logits are the same.

One row, in order:
1. the logits the sampler receives (anything applied before it, such as a grammar mask that
   sets forbidden tokens to -inf, is part of them);
2. presence and frequency penalties over the request's output tokens so far (sampling.penalties);
3. the reported distribution: log_softmax(logits / temperature), temperature 1 for greedy.
   A token's logprob and its top alternatives come from here: the distribution the filters
   below cut, not the cut one (a token min_p / top-k / top-p excludes still has its probability);
4. min_p: tokens less likely than min_p times the most likely one are removed;
5. top-k, top-p and the draw (kernels.sampling), or the argmax for greedy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from deepring.kernels.sampling import sample
from deepring.sampling.params import LOGPROB_FLOOR, SamplingParams, TokenLogprob
from deepring.sampling.penalties import OutputCounts, penalize

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) with 53 random bits, from (seed, position)."""
    return (splitmix64(splitmix64(seed & _MASK) ^ (position & _MASK)) >> 11) * 2.0**-53


class Row(Protocol):
    """What the sampler needs of a request (core.request.Request has it): its parameters and
    seed, its output so far (penalties), and num_tokens, the position its next token lands at.
    The object's identity keys its penalty counts across steps."""

    params: SamplingParams
    seed: int
    output_ids: list[int]

    @property
    def num_tokens(self) -> int: ...


@dataclass(eq=False)
class SampleRow:
    """A Row for callers without requests (tests, tools)."""

    params: SamplingParams
    seed: int
    num_tokens: int
    output_ids: list[int]


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[TokenLogprob | None]  # per row: None unless its params ask for logprobs


class Sampler:
    def __init__(self) -> None:
        self.counts = OutputCounts()

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        seeds: list[int],
        positions: list[int],
    ) -> list[int]:
        """Sample one token per row; row i is the request with params[i] and seeds[i], and the
        token lands at positions[i] (no output so far: penalties do nothing here)."""
        if not (len(params) == len(seeds) == len(positions)):
            raise ValueError("one params/seed/position per logits row")
        rows = [SampleRow(p, s, n, []) for p, s, n in zip(params, seeds, positions, strict=True)]
        return self.sample(logits, rows).tokens

    def sample(self, logits: torch.Tensor, rows: Sequence[Row]) -> Sampled:
        """One token per row of logits [B, V] (row i is rows[i]), with the log probabilities the
        rows ask for."""
        b, v = logits.shape
        if len(rows) != b:
            raise ValueError(f"{len(rows)} rows for {b} logits rows")
        params = [r.params for r in rows]
        if all(p.argmax_only for p in params):
            # max(-1).indices: the first maximum like argmax, but several times faster on CPU.
            return Sampled(logits.max(-1).indices.tolist(), [None] * b)
        dev = logits.device
        lg = logits
        pen = [i for i, p in enumerate(params) if p.penalized]
        if pen:
            counts = self.counts.gather(
                [rows[i] for i in pen], [rows[i].output_ids for i in pen], v, dev
            )
            idx = torch.tensor(pen, device=dev)
            pres = torch.tensor([params[i].presence_penalty for i in pen], device=dev)
            freq = torch.tensor([params[i].frequency_penalty for i in pen], device=dev)
            lg = lg.index_put((idx,), penalize(lg[idx].float(), counts, pres, freq))
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        logp = None
        if want:
            t = torch.tensor(
                [params[i].temperature or 1.0 for i in want], dtype=torch.float32, device=dev
            )
            logp = torch.log_softmax(lg[torch.tensor(want, device=dev)].float() / t[:, None], -1)
        cut = [i for i, p in enumerate(params) if p.min_p > 0 and not p.greedy]
        if cut:
            lg = _min_p(lg, cut, params)
        if all(p.greedy for p in params):
            tok = lg.max(-1).indices
        else:
            temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
            top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev)
            u = torch.tensor(
                [uniform(r.seed, r.num_tokens) for r in rows], dtype=torch.float64, device=dev
            )
            tok = sample(lg, temp, top_p, top_k, u)
        tokens = tok.tolist()
        out: list[TokenLogprob | None] = [None] * b
        if logp is not None:
            entries = _report(logp, tok[want], [params[i] for i in want])
            for i, entry in zip(want, entries, strict=True):
                out[i] = entry
        return Sampled(tokens, out)


def _min_p(lg: torch.Tensor, rows: list[int], params: list[SamplingParams]) -> torch.Tensor:
    """Rows' logits with the tokens below min_p x the top probability set to -inf. With
    temperature T, p_j >= min_p * p_max <=> x_j >= x_max + T * log(min_p)."""
    dev = lg.device
    idx = torch.tensor(rows, device=dev)
    x = lg[idx].float()
    shift = torch.tensor(
        [params[i].temperature * math.log(params[i].min_p) for i in rows], device=dev
    )
    thr = x.max(-1, keepdim=True).values + shift[:, None]
    return lg.index_put((idx,), torch.where(x < thr, float("-inf"), x))


def _report(logp: torch.Tensor, tok: torch.Tensor, params: list[SamplingParams]) -> list:
    """(logprob of the sampled token, [(id, logprob)] of the k most likely) per row, clamped
    to [LOGPROB_FLOOR, 0] (rounding can put a near-certain token a hair above 0)."""
    chosen = logp.gather(1, tok[:, None]).squeeze(1).clamp(LOGPROB_FLOOR, 0.0).tolist()
    k_max = min(max(p.logprobs or 0 for p in params), logp.shape[1])
    if k_max == 0:
        return [(c, []) for c in chosen]
    vals, ids = logp.topk(k_max, dim=-1)
    vals = vals.clamp(LOGPROB_FLOOR, 0.0).tolist()
    ids = ids.tolist()
    out = []
    for c, p, vs, ts in zip(chosen, params, vals, ids, strict=True):
        k = p.logprobs or 0
        out.append((c, list(zip(ts[:k], vs[:k], strict=True))))
    return out
