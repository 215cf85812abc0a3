"""How V4.1's paged main KV and indexer keys are stored: as they are, in the pool's dtype.

`KVCodec` is the one place that writes and reads those pages, so a compact storage format
(FP4 entries with per-group scales) can replace it without touching the attention code.
"""

from __future__ import annotations

import torch


class KVCodec:
    """Entries stored in the cache's own dtype (pages [blocks, entries, width])."""

    name = "plain"

    def store_main(self, pages: torch.Tensor, dest: torch.Tensor, rows: torch.Tensor) -> None:
        pages.view(-1, pages.shape[-1])[dest] = rows.to(pages.dtype)

    def load_main(self, pages: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        return pages.view(-1, pages.shape[-1])[flat]

    store_index = store_main
    load_index = load_main
