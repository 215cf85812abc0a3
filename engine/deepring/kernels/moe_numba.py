"""The MoE layer's numba CPU kernels: the router after its GEMM, and for a few rows (decode)
the routed experts plus the shared expert in one kernel (moe_rows_numba over MoEPacked)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from deepring.kernels.dispatch import (
    cpu_kernel,
    cpu_parallel_kernel,
    prange,
    run_rows,
    weight_array,
)


@cpu_kernel
def _route_kernel(logits, func, bias, hashed, idx, w, scaling):
    """The router after its GEMM, per token: scores, the top-k of score + bias (unless the
    hash table chose idx), and the chosen scores renormalised x scaling."""
    t_rows, n_exp = logits.shape
    k = idx.shape[1]
    one = np.float32(1.0)
    scores = np.empty(n_exp, np.float32)
    key = np.empty(n_exp, np.float32)
    for t in range(t_rows):
        if func == 1:  # softmax (see _FUNC_CODES)
            m = logits[t].max()
            s = np.float32(0.0)
            for e in range(n_exp):
                scores[e] = np.exp(logits[t, e] - m)
                s += scores[e]
            for e in range(n_exp):
                scores[e] /= s
        else:
            for e in range(n_exp):
                x = logits[t, e]
                if func == 0:  # sqrt(softplus), softplus linear above 20 as torch's
                    scores[e] = np.sqrt(x if x > 20 else np.log1p(np.exp(x)))
                else:
                    scores[e] = one / (one + np.exp(-x))
        if not hashed:  # top-k by repeated maximum: k is small (6 for V4)
            for e in range(n_exp):
                key[e] = scores[e] + bias[e]
            for j in range(k):
                best = 0
                for e in range(1, n_exp):
                    if key[e] > key[best]:
                        best = e
                idx[t, j] = best
                key[best] = -np.inf
        s = np.float32(0.0)
        for j in range(k):
            if idx[t, j] < 0 or idx[t, j] >= n_exp:
                raise IndexError("router: expert id out of range")
            s += scores[idx[t, j]]
        for j in range(k):
            w[t, j] = scores[idx[t, j]] / (s + np.float32(1e-20)) * scaling


# The router's scoring functions, as the kernel numbers them.
_FUNC_CODES = {"sqrtsoftplus": 0, "softmax": 1, "sigmoid": 2}
_NO_BIAS = np.zeros(1, np.float32)


def route_numba(
    logits: torch.Tensor,
    func: str,
    bias: torch.Tensor | None,
    hashed_idx: torch.Tensor | None,
    top_k: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids [T, k] and weights [T, k] from router logits [T, E] (fp32 CPU): the top-k of
    score + bias, or the hash table's picks `hashed_idx` when given."""
    t = logits.shape[0]
    if hashed_idx is not None:
        idx = hashed_idx.long().contiguous()
    else:
        idx = torch.empty(t, top_k, dtype=torch.long)
    w = torch.empty(t, top_k)
    _route_kernel(
        logits.contiguous().numpy(), _FUNC_CODES[func],
        _NO_BIAS if bias is None else weight_array(bias), hashed_idx is not None,
        idx.numpy(), w.numpy(), scaling,
    )  # fmt: skip
    return idx, w


# Up to this many rows the numba MoE (moe_rows_numba) runs instead of the torch path, and only
# for layers whose expert weights are small (it keeps a copy of the gate / up projections).
MOE_NUMBA_ROWS = 64
# Rows per thread below which the rows kernel does not split its rows (dispatch.run_rows).
_ROWS_PER_THREAD = 4
MOE_NUMBA_MAX_BYTES = 64 << 20


@cpu_kernel
def _down_into(h, g0, inter, limit, scale, down, act, out):
    """out += scale * down @ swiglu(g, u), g = h[g0 : g0 + inter], u the next inter values."""
    for j in range(inter):
        g = min(h[g0 + j], limit)
        u = min(max(h[g0 + inter + j], -limit), limit)
        act[j] = scale * (g / (np.float32(1.0) + np.exp(-g))) * u
    for c in range(down.shape[0]):
        s = np.float32(0.0)
        for j in range(inter):
            s += down[c, j] * act[j]
        out[c] += s


@cpu_kernel
def _check_expert_ids(idx, n_experts):
    for t in range(idx.shape[0]):
        for r in range(idx.shape[1]):
            if idx[t, r] < 0 or idx[t, r] >= n_experts:
                raise IndexError("moe: an expert id is out of range")


@cpu_kernel
def _moe_rows_kernel(h, idx, wts, down, shared_down, limit, out):
    """out[t] = shared(t) + sum_r wts[t, r] * expert_{idx[t, r]}(t), from the gate / up
    projections h [n, E * 2i + 2s] of every expert and then the shared one."""
    n, d = out.shape
    n_experts, _, inter = down.shape
    s_inter = shared_down.shape[1]
    _check_expert_ids(idx, n_experts)
    act = np.empty(max(inter, s_inter), np.float32)
    lim = np.float32(limit)
    for t in range(n):
        for c in range(d):
            out[t, c] = 0.0
        _down_into(h[t], n_experts * 2 * inter, s_inter, lim, np.float32(1.0), shared_down, act,
                   out[t])  # fmt: skip
        for r in range(idx.shape[1]):
            e = idx[t, r]
            _down_into(h[t], e * 2 * inter, inter, lim, wts[t, r], down[e], act, out[t])


@cpu_parallel_kernel
def _moe_rows_parallel(h, idx, wts, down, shared_down, limit, out, parts):
    """_moe_rows_kernel on `parts` ranges of rows, in parallel. The expert ids are checked
    first, here: an exception is not raised out of a parallel loop."""
    _check_expert_ids(idx, down.shape[0])
    n = h.shape[0]
    for c in prange(parts):
        a, b = c * n // parts, (c + 1) * n // parts
        _moe_rows_kernel(h[a:b], idx[a:b], wts[a:b], down, shared_down, limit, out[a:b])


def moe_rows_numba(
    h: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, packed: MoEPacked
) -> torch.Tensor:
    """Routed experts plus the shared expert for a few rows (decode) on fp32 CPU tensors, from
    packed.project(x) (the gate / up projections of every expert in one GEMM: few rows, cheaper
    than picking): one kernel for the chosen experts' activations and down projections, where
    the torch path runs about a dozen ops."""
    if h.dim() != 2 or h.shape[1] != packed.gate_up.shape[0] or not h.is_contiguous():
        raise ValueError(f"moe: {tuple(h.shape)} is not packed.project's output")
    if idx.shape != weights.shape or idx.shape[0] != h.shape[0]:
        raise ValueError(f"moe: idx {tuple(idx.shape)} and weights {tuple(weights.shape)} differ")
    out = h.new_empty(h.shape[0], packed.dim)
    run_rows(
        _moe_rows_kernel, _moe_rows_parallel, _ROWS_PER_THREAD, h.numpy(),
        idx.contiguous().numpy(), weights.float().contiguous().numpy(), packed.down,
        packed.shared_down, packed.limit, out.numpy(),
    )  # fmt: skip
    return out


class MoEPacked:
    """An MoE layer's weights as moe_rows_numba takes them: the gate / up projections of every
    routed expert, then the shared one's, then the router (when given) as one matrix
    [E * 2i + 2s (+ E), d] (a copy), the down projections as numpy views. Rebuilt when a weight
    changes."""

    def __init__(self) -> None:
        self._key: tuple | None = None

    def prepare(
        self,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        shared_gate: torch.Tensor,
        shared_up: torch.Tensor,
        shared_down: torch.Tensor,
        limit: float,
        router: torch.Tensor | None = None,
    ) -> MoEPacked:
        extra = [] if router is None else [router]
        ws = (gate_up, down, shared_gate, shared_up, shared_down, *extra)
        key = (*((w.data_ptr(), w._version) for w in ws), limit)
        if key != self._key:
            e, i2, d = gate_up.shape
            shapes = {
                "down": (down.shape, (e, d, i2 // 2)),
                "shared_up": (shared_up.shape, shared_gate.shape),
                "shared_gate": (shared_gate.shape[1:], (d,)),
                "shared_down": (shared_down.shape, (d, shared_gate.shape[0])),
            }
            if router is not None:
                shapes["router"] = (router.shape, (e, d))
            for name, (got, want) in shapes.items():
                if tuple(got) != tuple(want):
                    raise ValueError(f"moe: {name} has shape {tuple(got)}, expected {want}")
            self.dim = d
            with torch.no_grad():
                self.gate_up = torch.cat(
                    [gate_up.reshape(e * i2, d), shared_gate, shared_up, *extra]
                ).float()
            self.router_at = e * i2 + 2 * shared_gate.shape[0]
            self.down = weight_array(down)
            self.shared_down = weight_array(shared_down)
            self.limit = float(limit)
            self._key = key
        return self

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Every projection of x the packed matrix holds, [T, E * 2i + 2s (+ E)]."""
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"moe: rows {tuple(x.shape)} do not match the expert width {self.dim}")
        return F.linear(x, self.gate_up)
