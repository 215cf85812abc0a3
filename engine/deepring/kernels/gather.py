"""Row gathers for the torch paths, through index_select.

On CPU `x[idx]` and `cache[blocks, entries]` run torch's generic advanced-indexing kernel, which
costs several times what index_select does for the same rows (ad-hoc, 2 threads: a [32, 64]
gather of 64-wide rows from a paged cache took 90 us as cache[b, e] and 12 us as index_select of
the flat rows; 4096 rows of 64 took 138 us as x[idx] and 26 us as index_select).
"""

from __future__ import annotations

import torch


def take_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] for an integer index tensor of any shape over x's first dimension."""
    return x.index_select(0, idx.reshape(-1)).view(*idx.shape, *x.shape[1:])


def paged_rows(block_tables: torch.Tensor, e: torch.Tensor, epb: int) -> torch.Tensor:
    """Flat row of entry e of each request in a paged cache [blocks, epb, D] viewed as
    [blocks * epb, D]. block_tables: [S, max_blocks]; e: [N] (the same entries for every
    request) or [S, N]. Returns [S, N]."""
    if e.dim() == 1:
        return (block_tables[:, e // epb] * epb).add_(e % epb)
    return (block_tables.gather(1, e // epb) * epb).add_(e % epb)


def take_entries(cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Entries of a paged cache [blocks, epb, D] at flat rows (from paged_rows): [..., D]."""
    return take_rows(cache.view(-1, cache.shape[-1]), rows)
