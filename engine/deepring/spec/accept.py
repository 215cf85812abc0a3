"""Lossless verification of drafted tokens, and the deterministic randomness it consumes.

A row r drafted tokens d[r, 0..lengths[r]-1]; the target scored the prefix plus the first j
drafts for every j in 0..G, giving its distribution p[r, j] (or its argmax) for the token at
output position t0 + j, where t0 is the position of the row's next token. Verification emits
n accepted drafts followed by one token of the target's own: d[r, :n] + [next_id[r]], n + 1
tokens for one target step.

Greedy: a draft survives while it equals the target's argmax; next_id is the target's argmax
after the accepted prefix (the correction at the first mismatch, or the bonus token).

Sampled (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023): draft j was drawn from
the drafter's q[r, j]; it is accepted with probability min(1, p(x) / q(x)); at the first
rejection the token comes from the residual normalize(max(0, p - q)), and when every draft is
accepted the bonus token comes from p[r, lengths[r]]. Each emitted token is then distributed
exactly as the target's p given the tokens before it, whatever q is: the output is the target's,
only faster. That holds provided the number of drafts verified is fixed before the target's
randomness is drawn and does not depend on the draft tokens it decides about (the scheduler's
early break, spec.schedule).

Randomness. A seeded request's tokens must depend only on (seed, position), as in the plain
sampler (sampling.sampler: u = (SplitMix64(SplitMix64(seed) ^ position) >> 11) * 2^-53). Two
streams are used per output position t:
- "resample": the plain sampler's own number, SplitMix64(K ^ t) with K = SplitMix64(seed). It
  draws the residual or bonus token that lands at t, so a row verified with no drafts emits
  exactly the token plain sampling would (same p, same inverse-CDF convention as
  kernels.sampling: the first token whose inclusive prefix sum, in token-id order, exceeds
  u * total);
- "accept": SplitMix64(K ^ t ^ 2^63), the test of the draft that would land at t.
For positions below 2^63 the two streams' inputs differ in bit 63 (K's own bit versus its
complement), so no two draws of a request ever share an input, and SplitMix64 is a bijection
on 64-bit words: the streams never repeat a state, within one of them or across them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from deepring.sampling.sampler import splitmix64

_MASK = (1 << 64) - 1
_ACCEPT_TAG = 1 << 63  # XORed into the position: the accept stream (module docstring)
STREAMS = {"resample": 0, "accept": _ACCEPT_TAG}


# ---- randomness ------------------------------------------------------------------------------


def uniforms(seed: int, position: int, count: int, *, stream: str = "accept") -> list[float]:
    """`count` uniforms in [0, 1) for output positions position .. position + count - 1 of a
    request with `seed`, from `stream` ("accept": the draft tests; "resample": the residual /
    bonus draws, equal to sampling.sampler.uniform(seed, t))."""
    tag = _tag(stream)
    _check_positions(position, count)
    key = splitmix64(seed & _MASK)
    ts = range(position, position + count)
    return [(splitmix64(key ^ (t | tag)) >> 11) * 2.0**-53 for t in ts]


def step_uniforms(
    seeds: Sequence[int],
    positions: Sequence[int],
    max_drafts: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The uniforms of one verification step, vectorized (numpy uint64 arithmetic wraps modulo
    2^64 like the scalar SplitMix64): row r with seeds[r] whose next token lands at positions[r]
    gets u_accept[r, j] (accept stream, position + j, j < max_drafts) and u_resample[r, j]
    (resample stream, position + j, j <= max_drafts). Pass u_resample whole to accept_sampled:
    it picks column n_accepted[r], the position the drawn token lands at."""
    if len(seeds) != len(positions):
        raise ValueError(f"{len(seeds)} seeds for {len(positions)} positions")
    if max_drafts < 0:
        raise ValueError(f"max_drafts must be >= 0, got {max_drafts}")
    for pos in positions:
        _check_positions(pos, max_drafts + 1)
    r = len(seeds)
    key = _splitmix64_np(np.array([s & _MASK for s in seeds], dtype=np.uint64).reshape(r, 1))
    pos = np.array(positions, dtype=np.uint64).reshape(r, 1)
    t = pos + np.arange(max_drafts + 1, dtype=np.uint64)[None, :]
    res = _to_unit(_splitmix64_np(key ^ t))
    acc = _to_unit(_splitmix64_np(key ^ (t[:, :max_drafts] | np.uint64(_ACCEPT_TAG))))
    return (
        torch.from_numpy(acc).to(device=device),
        torch.from_numpy(res).to(device=device),
    )


def _tag(stream: str) -> int:
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {sorted(STREAMS)}, got {stream!r}")
    return STREAMS[stream]


def _check_positions(position: int, count: int) -> None:
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if position < 0 or position + count > _ACCEPT_TAG:
        raise ValueError(f"positions must lie in [0, 2^63), got {position} + {count}")


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _to_unit(x: np.ndarray) -> np.ndarray:
    # 53 high bits, exactly as sampling.sampler.uniform (both conversions are exact in float64).
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


# ---- verification ----------------------------------------------------------------------------


def accept_greedy(
    draft_ids: torch.Tensor,
    lengths: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_accepted [R], next_id [R]): n_accepted[r] is the longest j <= lengths[r] with
    draft_ids[r, :j] == target_ids[r, :j], next_id[r] = target_ids[r, n_accepted[r]].
    target_ids[r, j] is the target's argmax after the prefix plus the first j drafts.
    validate: check lengths' values (a device sync; the shapes are always checked)."""
    r, g = _check_drafts(draft_ids, lengths, validate)
    if target_ids.shape != (r, g + 1):
        raise ValueError(f"target_ids must be [{r}, {g + 1}], got {list(target_ids.shape)}")
    n = _leading(draft_ids == target_ids[:, :g], lengths)
    return n, target_ids.gather(1, n[:, None]).squeeze(1)


def accept_sampled(
    draft_ids: torch.Tensor,
    lengths: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    u_accept: torch.Tensor,
    u_resample: torch.Tensor,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_accepted [R], next_id [R]) by speculative sampling (module docstring).

    draft_ids [R, G], lengths [R] (row r verifies its first lengths[r] drafts);
    q [R, G, V]: the drafter's distributions the drafts were drawn from, or None when the
    drafts are deterministic (q one-hot at the draft: accept with probability p(x), residual
    p without x); p [R, G + 1, V]: the target's. Both are the final sampling distributions
    (temperature, penalties, filters, grammar masks applied; zeros allowed); a row that does not
    sum to 1 is treated as unnormalised weights.
    u_accept [R, G]: the test of draft j passes when u < min(1, p(x) / q(x));
    u_resample [R] or [R, G + 1]: the inverse-CDF draw of the token after the accepted drafts
    (with [R, G + 1], column n_accepted[r] is used: step_uniforms' per-position numbers).
    Degenerate rows: a zero residual (p <= q everywhere, possible only through rounding or
    unnormalised input) falls back to p; lengths[r] == 0 is a plain draw from p[r, 0].
    validate: check values (lengths in range, distributions finite, non-negative, with mass:
    a device sync); the shapes are always checked."""
    r, g = _check_drafts(draft_ids, lengths, validate)
    if p.dim() != 3 or p.shape[:2] != (r, g + 1):
        raise ValueError(f"p must be [{r}, {g + 1}, V], got {list(p.shape)}")
    v = p.shape[2]
    if q is not None and q.shape != (r, g, v):
        raise ValueError(f"q must be [{r}, {g}, {v}] like p, got {list(q.shape)}")
    if u_accept.shape != (r, g):
        raise ValueError(f"u_accept must be [{r}, {g}], got {list(u_accept.shape)}")
    if u_resample.shape not in ((r,), (r, g + 1)):
        shape = list(u_resample.shape)
        raise ValueError(f"u_resample must be [{r}] or [{r}, {g + 1}], got {shape}")
    if v == 0:
        raise ValueError("an empty vocabulary")
    if r == 0:
        empty = torch.zeros(0, dtype=torch.long, device=p.device)
        return empty, empty.clone()
    # The normalisers [R, G+1] (not normalised copies of p and q: those are [R, G+1, V]).
    # Summed in float32 unless the input is float64: a float64 reduction over the whole
    # [R, G+1, V] is some 40x slower on a CPU, and the sums need no more than float32's 1e-7.
    p_sum = _sums(p)
    q_sum = None if q is None else _sums(q)
    if validate:
        _check_dist(p, p_sum, "p")
        if q is not None:
            _check_dist(q, q_sum, "q")
    # Double precision for the test and the draw (on [R, G] and [R, V] only): the ratio of
    # two small probabilities, and a cumulative sum over 129k tokens, both want the headroom.
    ids = draft_ids.to(p.device, torch.long)
    lengths = lengths.to(p.device)
    px = p[:, :g].gather(2, ids[..., None]).squeeze(2).double() / p_sum[:, :g]
    if q_sum is None:
        qx = torch.ones_like(px)
    else:
        qx = q.gather(2, ids[..., None]).squeeze(2).double() / q_sum
    # u < min(1, px/qx) written without the division: u < 1 makes the min implicit, and a
    # draft to which q gave no mass (qx = 0) is accepted exactly when p gives it some. The
    # uniforms may come from the host (step_uniforms builds them there by default).
    ok = u_accept.to(p.device, torch.float64) * qx < px
    n = _leading(ok, lengths)
    rows = torch.arange(r, device=p.device)
    weights = p[rows, n].double() / p_sum[rows, n][:, None]  # [R, V]: p where the token lands
    rejected = n < lengths
    if g > 0 and bool(rejected.any()):
        at = n.clamp(max=g - 1)
        if q is None:
            # q one-hot at x: max(0, p - q) is p with x removed (p(x) - 1 <= 0).
            resid = weights.scatter(1, ids[rows, at][:, None], 0.0)
        else:
            q_at = q[rows, at].double() / q_sum[rows, at][:, None]
            resid = (weights - q_at).clamp(min=0.0)
        # Fall back to p where the residual has no mass (p <= q everywhere after rounding).
        use = rejected & (resid.sum(-1) > 0)
        weights = torch.where(use[:, None], resid, weights)
    u = u_resample.to(p.device, torch.float64)
    if u.dim() == 2:
        u = u.gather(1, n[:, None]).squeeze(1)
    return n, _inverse_cdf(weights, u)


def _check_drafts(draft_ids: torch.Tensor, lengths: torch.Tensor, validate: bool):
    if draft_ids.dim() != 2:
        raise ValueError(f"draft_ids must be [R, G], got {list(draft_ids.shape)}")
    r, g = draft_ids.shape
    if lengths.shape != (r,):
        raise ValueError(f"lengths must be [{r}], got {list(lengths.shape)}")
    if validate and r and bool(((lengths < 0) | (lengths > g)).any()):
        raise ValueError(f"lengths must lie in [0, {g}], got {lengths.tolist()}")
    return r, g


def _sums(x: torch.Tensor) -> torch.Tensor:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.sum(-1, dtype=acc).double()


def _check_dist(x: torch.Tensor, sums: torch.Tensor, name: str) -> None:
    """Non-negative (a NaN fails the min too), finite (an inf makes its sum inf), with mass.
    A min and the sums already computed: isfinite over [R, G+1, V] costs more than the
    verification itself on a CPU."""
    if x.numel() == 0:
        return
    if not bool(x.amin() >= 0) or not bool(torch.isfinite(sums).all()):
        raise ValueError(f"{name} must hold finite, non-negative probabilities")
    if not bool((sums > 0).all()):
        raise ValueError(f"every distribution in {name} needs positive mass")


def _leading(ok: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per row, the number of leading True among the first lengths[r] columns of ok [R, G]."""
    g = ok.shape[1]
    within = torch.arange(g, device=ok.device)[None, :] < lengths[:, None].to(ok.device)
    return (ok & within).long().cumprod(1).sum(1)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of non-negative weights [R, V] (each with mass), the first token whose inclusive
    prefix sum exceeds u * total: kernels.sampling's convention, so a zero-weight token is
    never drawn (the prefix sum steps past the target only where a token has weight)."""
    cdf = torch.cumsum(weights, -1)
    total = cdf[:, -1]
    # No prefix sum exceeds the total itself: u < 1 keeps u * total below it, and the guard
    # keeps it so for a caller's u == 1.0 too (the kernel clamps to the last token instead,
    # weight or not).
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
