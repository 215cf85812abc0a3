"""Case builders shared by the numba kernel tests (test_kernels_numba*.py)."""

from __future__ import annotations

import contextlib

import torch
from deepring.kernels import dispatch


@contextlib.contextmanager
def kernels(monkeypatch, backend: str):
    """DEEPRING_KERNELS=backend inside the block; the cached choice is forgotten on entry and
    on exit."""
    monkeypatch.setenv("DEEPRING_KERNELS", backend)
    dispatch.reset()
    try:
        yield
    finally:
        dispatch.reset()


def hc_params(g: torch.Generator, hc: int, d: int) -> tuple[torch.Tensor, ...]:
    n = (2 + hc) * hc
    fn = torch.randn(n, hc * d, generator=g) * 0.1
    base = torch.randn(n, generator=g)
    # One scale per group (pre, post, comb), as HyperConnection builds it.
    s = torch.rand(3, generator=g) + 0.5
    scale = torch.cat([s[0].expand(hc), s[1].expand(hc), s[2].expand(hc * hc)])
    return fn, base, scale


def decode_case(g: torch.Generator, mode: str, kv_in_ring: bool, slots: list[int]) -> tuple:
    """Decode attention arguments: rows inside and past the first window (a partly empty and
    a wrapped ring), scattered block tables, CSA picks with -1 padding or HCA's every causal
    entry; with kv_in_ring the ring holds each row's new key and kv is NaN (it must be unused)."""
    h, d, ring_len, ratio, epb = 3, 16, 8, 4, 4
    positions = torch.tensor([0, 3, 6, 14, 42])
    b = len(positions)
    q, kv = torch.randn(b, h, d, generator=g), torch.randn(b, d, generator=g)
    ring = torch.randn(b, ring_len, d, generator=g)
    comp = torch.randn(64, epb, d, generator=g)
    tables = torch.randperm(64, generator=g)[: b * 12].view(b, 12)
    idx = None
    if mode == "topk":
        idx = torch.full((b, 4), -1)
        for i, p in enumerate(positions.tolist()):
            pick = torch.randperm((p + 1) // ratio, generator=g)[:4]
            idx[i, : len(pick)] = pick
    if kv_in_ring:
        ring[torch.tensor(slots), positions % ring_len] = kv
        kv = torch.full_like(kv, float("nan"))
    c = None if mode == "window" else comp
    sinks = torch.randn(h, generator=g)
    return (q, kv, ring, c, positions, torch.tensor(slots), tables, idx, ratio, sinks, 0.3, 6)
