"""Engram: n-gram hash embeddings gated into the hyper-connection streams.

For each token and each n-gram order n = 2 .. max_ngram_size, the ids of the last n tokens
(the pad id before the sequence) are hashed once per hash head: the XOR of id_j * m_j (m_j
odd per-layer multipliers from a seeded NumPy generator) modulo the head's prime table size,
offset into the layer's single table. The heads' embeddings, concatenated, project (`wkv`) to
one key per stream and one value; each stream adds the value gated by
sigmoid(signed_sqrt(<rms(h_i) * q_i, rms(k_i) * k_i> / sqrt(D))).

The tables are large (V4.1-Flash: 384M rows per layer) and addressed by hashes known from the
tokens alone, so they stay in host memory: a step gathers its rows there and moves only them to
the accelerator. `Engram._apply` keeps the table out of `.to(device)`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from deepring.model.linear import linear
from deepring.model.v41.config import EngramConfig, V41Config, engram_table_sizes

HASH_SEED = 0


def hash_multipliers(layer: int, max_ngram: int, vocab: int) -> torch.Tensor:
    """[max_ngram] odd int64 multipliers of one layer. Bounded so that id * m never overflows
    int64 (ids < vocab), which keeps every hash non-negative."""
    bound = max(1, (np.iinfo(np.int64).max // vocab) // 2)
    rng = np.random.default_rng(HASH_SEED + 10007 * layer)
    return torch.from_numpy(rng.integers(0, bound, size=(max_ngram,), dtype=np.int64) * 2 + 1)


class Engram(nn.Module):
    def __init__(self, config: V41Config, layer: int, lookup: torch.Tensor | None = None) -> None:
        """lookup: token id -> compressed id (model.v41.vocab), required when the config
        compresses the vocabulary (hashing raw ids would address the wrong rows)."""
        super().__init__()
        e: EngramConfig = config.engram
        if e.compressed_vocab_size and lookup is None:
            raise ValueError(
                "engram_compressed_vocab_size is set: Engram needs the checkpoint's "
                "tokenizer.json for its compressed vocabulary"
            )
        # Host memory, like the table: the hashes are computed there.
        self.lookup = lookup.cpu() if e.compressed_vocab_size else None
        self.cfg, self.hc, self.dim = e, config.hc_mult, config.hidden_size
        self.eps = config.rms_norm_eps
        sizes = engram_table_sizes(e)[layer]  # [orders][heads]
        flat = [p for per_order in sizes for p in per_order]
        # Hashing runs in host memory beside the table: plain CPU tensors, not buffers.
        self.primes = torch.tensor(flat, dtype=torch.long)
        self.offsets = torch.tensor(np.concatenate([[0], np.cumsum(flat)[:-1]]), dtype=torch.long)
        # The multipliers' bound depends on the vocabulary the hashes see (DeepInfer takes the
        # compressed vocabulary's real size, not the config's number).
        vocab = int(self.lookup.max()) + 1 if self.lookup is not None else config.vocab_size
        self.mults = hash_multipliers(layer, e.max_ngram_size, vocab)
        self.q_weight = nn.Parameter(torch.zeros(self.hc, self.dim))
        self.k_weight = nn.Parameter(torch.zeros(self.hc, self.dim))
        self.embed = nn.Embedding(int(sum(flat)), e.head_dim)
        self.wkv = linear(e.n_tables * e.head_dim, (self.hc + 1) * self.dim)
        self.wkv.quantisable = False  # its weight's dtype is the gathered rows' (forward)

    def _apply(self, fn, recurse=True):
        """Everything but the table follows .to()/.cuda(); the table stays in host memory (its
        dtype still follows, so casts for inference apply to it)."""
        table = self.embed.weight
        super()._apply(fn, recurse)
        moved = self.embed.weight
        if moved.device.type != "cpu":
            self.embed.weight = nn.Parameter(
                table.data.to(moved.dtype), requires_grad=table.requires_grad
            )
        return self

    def rows(self, ngram_ids: torch.Tensor) -> torch.Tensor:
        """Table rows [T, tables] of the n-grams: ngram_ids [T, max_ngram], column j the id j
        tokens back (pad before the sequence)."""
        ids = ngram_ids.to(torch.long)
        if self.lookup is not None:
            ids = self.lookup[ids]
        cols = []
        h = ids[:, 0] * self.mults[0]
        for n in range(2, self.cfg.max_ngram_size + 1):
            h = torch.bitwise_xor(h, ids[:, n - 1] * self.mults[n - 1])
            cols.append(h)
        per_order = torch.stack(cols, 1).repeat_interleave(self.cfg.n_heads, dim=1)
        return per_order % self.primes + self.offsets

    def forward(
        self, h: torch.Tensor, ngram_ids: torch.Tensor, image: torch.Tensor | None = None
    ) -> torch.Tensor:
        """h [T, hc, D] streams -> streams with the gated n-gram memory added; image rows
        ([T] bool) take none (DeepInfer's gate masks image tokens)."""
        rows = self.rows(ngram_ids.cpu())
        emb = self.embed.weight[rows.reshape(-1)]  # gathered in host memory
        emb = emb.view(rows.shape[0], -1).to(device=h.device, dtype=self.wkv.weight.dtype)
        kv = self.wkv(emb)
        t = h.shape[0]
        keys = kv[:, : self.hc * self.dim].view(t, self.hc, self.dim)
        value = kv[:, self.hc * self.dim :]
        hn = F.rms_norm(h.float(), (self.dim,), None, self.eps) * self.q_weight.float()
        kn = F.rms_norm(keys.float(), (self.dim,), None, self.eps) * self.k_weight.float()
        dot = (hn * kn).sum(-1) / self.dim**0.5
        gate = torch.sigmoid(dot.sign() * dot.abs().clamp(min=1e-6).sqrt())
        if image is not None:
            gate = gate.masked_fill(image[:, None], 0.0)
        return (h.float() + gate.unsqueeze(-1) * value.float().unsqueeze(1)).to(h.dtype)
