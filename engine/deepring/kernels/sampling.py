"""Token sampling from logits with temperature, top-k and top-p, given one uniform per row.

Sort-free definitions, so a kernel can evaluate them with threshold searches and every row's
result depends on that row alone:
- greedy (temperature <= 0): the first index of the maximum logit;
- top-k (0 < k < V): keep logits >= the k-th largest logit (ties at the boundary all kept);
- top-p (< 1), on the top-k-renormalised distribution: keep token i when the probability mass of
  tokens strictly more likely than i is below top_p;
- the kept probabilities are renormalised and token = the first index whose inclusive prefix
  sum, in token-id order, exceeds u * total.
"""

from __future__ import annotations

import torch

from deepring.kernels.dispatch import HAVE_TRITON, use_triton


def sample_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """logits: [B, V]; temperature, top_p: [B] fp32; top_k: [B] int (<= 0: off); uniforms: [B]."""
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.long, device=logits.device)
    greedy = temperature <= 0
    if bool(greedy.any()):
        out[greedy] = logits[greedy].argmax(-1)
    rows = (~greedy).nonzero().flatten()
    if rows.numel() == 0:
        return out
    lg = logits[rows].float() / temperature[rows, None].float()
    k = top_k[rows]
    kmask = (k > 0) & (k < v)
    if bool(kmask.any()):
        k_max = int(torch.where(kmask, k, 1).max())
        top = torch.topk(lg, k_max, dim=-1).values  # sorted, descending; no full-vocab sort
        kth = top.gather(1, (torch.where(kmask, k, 1) - 1)[:, None])
        lg = torch.where(kmask[:, None] & (lg < kth), float("-inf"), lg)
    probs = torch.softmax(lg, -1)
    p = top_p[rows].float()
    pmask = p < 1.0
    if bool(pmask.any()):
        ps = torch.sort(probs, dim=-1, descending=True).values
        kept = (torch.cumsum(ps, -1) - ps) < p[:, None]
        n_kept = kept.sum(-1).clamp(min=1)
        thr = ps.gather(1, (n_kept - 1)[:, None])
        probs = torch.where(pmask[:, None] & (probs < thr), 0.0, probs)
    cdf = torch.cumsum(probs.double(), -1)
    target = uniforms[rows].double() * cdf[:, -1]
    tok = torch.searchsorted(cdf, target[:, None], right=True).flatten()
    out[rows] = tok.clamp(max=v - 1)
    return out


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _key(x):
        # Order-preserving map from fp32 to int32: negative floats get their magnitude flipped.
        b = x.to(tl.int32, bitcast=True)
        return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)

    @triton.jit
    def _unkey(k):
        b = tl.where(k >= 0, k, k ^ 0x7FFFFFFF)
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _sample_kernel(
        logits_ptr, temp_ptr, top_p_ptr, top_k_ptr, u_ptr, out_ptr, V, stride_l,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride_l
        temp = tl.load(temp_ptr + row)
        offs = tl.arange(0, BLOCK)
        if temp <= 0:
            best = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
            best_i = tl.full([BLOCK], 2147483647, dtype=tl.int32)
            for start in range(0, V, BLOCK):
                cols = start + offs
                x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
                better = x > best
                best_i = tl.where(better, cols, best_i)
                best = tl.where(better, x, best)
            m = tl.max(best, axis=0)
            tok = tl.min(tl.where(best == m, best_i, 2147483647), axis=0)
            tl.store(out_ptr + row, tok.to(tl.int64))
        else:
            inv_t = 1.0 / temp
            mx = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
            for start in range(0, V, BLOCK):
                cols = start + offs
                x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
                mx = tl.maximum(mx, x * inv_t)
            m = tl.max(mx, axis=0)
            # top-k: the k-th largest value, by bisection on the ordered integer keys.
            k = tl.load(top_k_ptr + row).to(tl.int32)
            kth = float("-inf")
            if (k > 0) & (k < V):
                lo = _key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
                hi = _key(m).to(tl.int64)
                for _ in range(34):
                    mid = (lo + hi + 1) // 2
                    thr = _unkey(mid.to(tl.int32))
                    cnt = tl.zeros([BLOCK], dtype=tl.int32)
                    for start in range(0, V, BLOCK):
                        cols = start + offs
                        x = tl.load(base + cols, mask=cols < V, other=float("-inf")) * inv_t
                        cnt += ((x >= thr) & (cols < V)).to(tl.int32)
                    ok = tl.sum(cnt, axis=0) >= k
                    lo = tl.where(ok, mid, lo)
                    hi = tl.where(ok, hi, mid - 1)
                kth = _unkey(lo.to(tl.int32))
            z = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, V, BLOCK):
                cols = start + offs
                x = tl.load(base + cols, mask=cols < V, other=float("-inf")) * inv_t
                z += tl.where((x >= kth) & (cols < V), tl.exp(x - m), 0.0)
            inv_z = 1.0 / tl.sum(z, axis=0)
            # top-p: the smallest probability v with mass(p > v) < top_p, by bisection.
            top_p = tl.load(top_p_ptr + row)
            pthr = 0.0
            if top_p < 1.0:
                lo2 = tl.zeros([], dtype=tl.int64)
                hi2 = _key(tl.full([], 1.0, tl.float32)).to(tl.int64)
                for _ in range(32):
                    mid = (lo2 + hi2) // 2
                    v = _unkey(mid.to(tl.int32))
                    acc = tl.zeros([BLOCK], dtype=tl.float32)
                    for start in range(0, V, BLOCK):
                        cols = start + offs
                        x = tl.load(base + cols, mask=cols < V, other=float("-inf")) * inv_t
                        p = tl.where((x >= kth) & (cols < V), tl.exp(x - m) * inv_z, 0.0)
                        acc += tl.where(p > v, p, 0.0)
                    ok = tl.sum(acc, axis=0) < top_p
                    hi2 = tl.where(ok, mid, hi2)
                    lo2 = tl.where(ok, lo2, mid + 1)
                pthr = _unkey(lo2.to(tl.int32))
            tot = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, V, BLOCK):
                cols = start + offs
                x = tl.load(base + cols, mask=cols < V, other=float("-inf")) * inv_t
                p = tl.where((x >= kth) & (cols < V), tl.exp(x - m) * inv_z, 0.0)
                tot += tl.where(p >= pthr, p, 0.0)
            target = tl.load(u_ptr + row).to(tl.float32) * tl.sum(tot, axis=0)
            # Inverse CDF in token-id order: first index whose inclusive prefix sum exceeds target.
            carry = 0.0
            tok = V - 1
            found = 0
            for start in range(0, V, BLOCK):
                cols = start + offs
                x = tl.load(base + cols, mask=cols < V, other=float("-inf")) * inv_t
                p = tl.where((x >= kth) & (cols < V), tl.exp(x - m) * inv_z, 0.0)
                p = tl.where(p >= pthr, p, 0.0)
                c = tl.cumsum(p, axis=0) + carry
                hit = (c > target) & (p > 0)
                first = tl.min(tl.where(hit, cols, 2147483647), axis=0)
                take = (found == 0) & (first < 2147483647)
                tok = tl.where(take, first, tok)
                found = tl.where(take, 1, found)
                carry += tl.sum(p, axis=0)
            tl.store(out_ptr + row, tok.to(tl.int64))


def sample_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    uniforms: torch.Tensor,
    block: int = 1024,
) -> torch.Tensor:
    b, v = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(b, dtype=torch.long, device=logits.device)
    if b:
        _sample_kernel[(b,)](
            logits, temperature.float().contiguous(), top_p.float().contiguous(),
            top_k.to(torch.int32).contiguous(), uniforms.float().contiguous(), out, v,
            logits.stride(0), BLOCK=block,
        )  # fmt: skip
    return out


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    fn = sample_triton if use_triton(logits) else sample_torch
    return fn(logits, temperature, top_p, top_k, uniforms)
