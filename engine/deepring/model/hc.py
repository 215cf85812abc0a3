"""Manifold-constrained hyper-connections (mHC): hc_mult residual streams per token.

Before each sublayer the streams are RMS-normalised together and projected to three mixes:
`pre` (how the streams collapse into the sublayer input), `post` (how the sublayer output is
spread back) and `comb` (how streams feed each other), the last made doubly stochastic by
Sinkhorn-Knopp iterations. Everything here runs in fp32.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Up to this many rows, one fused norm beats normalising after the projection.
_FEW_ROWS = 64


def _rms_mix(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.linear(rms_norm(streams flattened), weight) in fp32."""
    flat = h.reshape(h.shape[0], h.shape[1] * h.shape[2]).float()
    if flat.shape[0] <= _FEW_ROWS:  # one fused norm beats the ops below for a few rows only
        return F.linear(F.rms_norm(flat, (flat.shape[1],), None, eps), weight)
    # The norm is one scale per row, so it can follow the (narrow) projection: one read of the
    # wide input for its norm instead of writing and re-reading a normalised copy.
    ms = torch.linalg.vector_norm(flat, dim=-1, keepdim=True).square_().div_(flat.shape[1])
    return F.linear(flat, weight).mul_(ms.add_(eps).rsqrt_())


def _sinkhorn_np(d: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """sinkhorn in place on a NumPy array laid out [n, n, T] (d[i, j, t] = comb[t, i, j]): with
    the row axis innermost each sum is a pass over whole rows, half the time of summing
    length-n axes (same arithmetic, same results)."""
    e = np.float32(eps)
    n, _, t = d.shape
    col = np.empty((1, n, t), np.float32)
    row = np.empty((n, 1, t), np.float32)
    np.add.reduce(d, axis=0, keepdims=True, out=col)
    col += e
    d /= col
    for _ in range(iters - 1):
        np.add.reduce(d, axis=1, keepdims=True, out=row)
        row += e
        d /= row
        np.add.reduce(d, axis=0, keepdims=True, out=col)
        col += e
        d /= col
    return d


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Alternate column / row normalisation of [T, n, n] positive matrices (column first).

    Dozens of small sequential ops, each one pass over the rows once the row axis is innermost
    ([n, n, T]). On CPU they run in NumPy: each costs about a microsecond there against several
    through torch's dispatch, which decides for a few rows (decode) and still wins at thousands
    (ad-hoc timing at 4096 rows: 0.9 ms against 1.1 ms).
    """
    if comb.device.type == "cpu" and comb.dtype == torch.float32 and not comb.requires_grad:
        d = _sinkhorn_np(np.ascontiguousarray(comb.numpy().transpose(1, 2, 0)), iters, eps)
        return torch.from_numpy(np.ascontiguousarray(d.transpose(2, 0, 1)))
    return _sinkhorn_torch(comb, iters, eps)


def _sinkhorn_torch(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """sinkhorn through torch ops (GPU), also [n, n, T] inside."""
    c = comb.permute(1, 2, 0).contiguous()  # [n, n, T]: c[i, j, t] = comb[t, i, j]
    n, _, t = c.shape
    rows = c.new_empty(n, 1, t)
    cols = c.new_empty(1, n, t)
    torch.sum(c, 0, keepdim=True, out=cols)
    c.div_(cols.add_(eps))
    for _ in range(iters - 1):
        torch.sum(c, 1, keepdim=True, out=rows)
        c.div_(rows.add_(eps))
        torch.sum(c, 0, keepdim=True, out=cols)
        c.div_(cols.add_(eps))
    # Contiguous [T, n, n]: bmm over a permuted view falls back to one small GEMM per row
    # (measured 11x slower at T=2048).
    return c.permute(2, 0, 1).contiguous()


def _collapse(pre: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """sum_j pre_j * h_j in fp32, returned in h's dtype: [T, hc] x [T, hc, D] -> [T, D]."""
    if h.dtype == pre.dtype:  # one batched GEMM, no [T, hc, D] product in memory
        return torch.bmm(pre.unsqueeze(1), h).squeeze(1)
    return (pre.unsqueeze(-1) * h).sum(1).to(h.dtype)


class HyperConnection(nn.Module):
    def __init__(self, hc_mult: int, hidden: int, iters: int, hc_eps: float, norm_eps: float):
        super().__init__()
        self.hc, self.iters, self.hc_eps, self.norm_eps = hc_mult, iters, hc_eps, norm_eps
        n = (2 + hc_mult) * hc_mult
        self.fn = nn.Parameter(torch.zeros(n, hc_mult * hidden, dtype=torch.float32))
        self.base = nn.Parameter(torch.zeros(n, dtype=torch.float32))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float32))

    def _scale_vector(self) -> torch.Tensor:
        """scale[0] for the pre mixes, scale[1] for post, scale[2] for comb; rebuilt only when
        the parameter changes (tracked by its version counter)."""
        key = (self.scale.data_ptr(), self.scale._version)
        if getattr(self, "_scale_key", None) != key:
            hc, s = self.hc, self.scale.detach()
            self._scale_vec = torch.cat(
                [s[0:1].expand(hc), s[1:2].expand(hc), s[2:3].expand(hc * hc)]
            )
            self._scale_key = key
        return self._scale_vec

    def _np_params(self) -> tuple[np.ndarray, np.ndarray]:
        """base and the scale vector as NumPy arrays (views, rebuilt when a parameter changes)."""
        key = (self.base.data_ptr(), self.base._version, self.scale._version)
        if getattr(self, "_np_key", None) != key:
            self._np = (self.base.detach().numpy(), self._scale_vector().numpy())
            self._np_key = key
        return self._np

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: [T, hc, D]. Returns post [T, hc], comb_t [T, hc, hc] (comb_t[k, j]: stream j into
        stream k) and the collapsed sublayer input [T, D] in h's dtype."""
        mix = _rms_mix(h, self.fn, self.norm_eps)
        if mix.device.type == "cpu" and not mix.requires_grad:  # see sinkhorn
            pre, post, comb_t = self._mixes_np(mix)
        else:
            pre, post, comb_t = self._mixes_torch(mix)
        return post, comb_t, _collapse(pre, h)

    def _mixes_torch(self, mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """pre, post and comb_t of forward from the mix projection, through torch ops."""
        hc, eps = self.hc, self.hc_eps
        # One scale per group (pre, post, comb), applied to the whole mix vector at once.
        z = torch.addcmul(self.base, mix, self._scale_vector())
        gates = torch.sigmoid(z[:, : 2 * hc])
        pre = gates[:, :hc] + eps
        post = gates[:, hc:] * 2
        comb = torch.softmax(z[:, 2 * hc :].view(-1, hc, hc), -1) + eps
        return pre, post, sinkhorn(comb, self.iters, eps).transpose(1, 2)

    def _mixes_np(self, mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """_mixes_torch in NumPy for CPU (fp32 throughout), with the row axis innermost (see
        _sinkhorn_np)."""
        hc, e = self.hc, np.float32(self.hc_eps)
        base, scale = self._np_params()
        z = np.ascontiguousarray((mix.numpy() * scale + base).T)  # [mixes, T]
        gates = 1 / (1 + np.exp(-z[: 2 * hc]))
        d = z[2 * hc :].reshape(hc, hc, -1)  # d[i, j, t] = comb logits[t, i, j]
        d = np.exp(d - d.max(1, keepdims=True))
        d /= d.sum(1, keepdims=True)
        d += e
        d = _sinkhorn_np(d, self.iters, self.hc_eps)
        pre = np.ascontiguousarray((gates[:hc] + e).T)
        post = np.ascontiguousarray((gates[hc:] * np.float32(2)).T)
        comb_t = np.ascontiguousarray(d.transpose(2, 1, 0))  # comb_t[t, k, j] = d[j, k, t]
        return torch.from_numpy(pre), torch.from_numpy(post), torch.from_numpy(comb_t)

    @staticmethod
    def merge(
        h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb_t: torch.Tensor
    ) -> torch.Tensor:
        """New streams: stream k = post_k * out + sum_j comb_t[k, j] * h_j."""
        dt = h.dtype
        spread = (post if post.dtype == dt else post.to(dt)).unsqueeze(-1) * out.unsqueeze(1)
        # In place: no copy of spread.
        return spread.baddbmm_(comb_t if comb_t.dtype == dt else comb_t.to(dt), h)


class HyperHead(nn.Module):
    """The final collapse of the streams before the output norm."""

    def __init__(self, hc_mult: int, hidden: int, hc_eps: float, norm_eps: float):
        super().__init__()
        self.hc_eps, self.norm_eps = hc_eps, norm_eps
        self.hc_fn = nn.Parameter(torch.zeros(hc_mult, hc_mult * hidden, dtype=torch.float32))
        self.hc_base = nn.Parameter(torch.zeros(hc_mult, dtype=torch.float32))
        self.hc_scale = nn.Parameter(torch.ones(1, dtype=torch.float32))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mix = _rms_mix(h, self.hc_fn, self.norm_eps)
        pre = torch.sigmoid(mix * self.hc_scale + self.hc_base) + self.hc_eps
        return _collapse(pre, h)
