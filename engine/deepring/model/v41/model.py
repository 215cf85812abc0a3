"""The DeepSeek V4.1 causal LM over the serving caches (same step interface as DeepseekV4).

Parameter names are the official checkpoint's (`layers.N.attn.wq_a.weight`, `embed.weight`,
`head.weight`, `layers.N.ffn.experts.E.w1.weight`, `mtp.N.main_proj.weight`, ...), so an export
in that naming loads name for name (model.v41.weights).

DSpark: the drafter's stages (`mtp.0..`: sliding-window blocks with their own smaller MoE; the
first owns `main_proj` / `main_norm`, the last the output `norm`, `markov_head` and
`confidence_head`; model.v41.dspark) fill the `mtp` slot; a step returns the taps they read
(forward's `taps`), and their window rings follow the backbone's in the cache.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from deepring import env
from deepring.cache.pool import KVCachePool
from deepring.kernels.greedy_head import GreedyArgmax
from deepring.kernels.hyper import collapse
from deepring.model.batch import ForwardBatch
from deepring.model.linear import linear
from deepring.model.model import StepOutput
from deepring.model.norm import RMSNorm
from deepring.model.rope import RopeTables
from deepring.model.v41.attention import StepShare
from deepring.model.v41.config import V41Config
from deepring.model.v41.dspark import V41Drafter
from deepring.model.v41.kvquant import KVCodec
from deepring.model.v41.layer import V41Block
from deepring.model.v41.vision import (
    Aligner,
    VisionConfig,
    VisionTower,
    embed_images,
    image_rows,
)
from deepring.model.v41.vocab import compressed_vocabulary


class DeepseekV41(nn.Module):
    def __init__(self, config: V41Config, tokenizer: str | Path | None = None) -> None:
        """tokenizer: the checkpoint's tokenizer.json, needed when Engram compresses the
        vocabulary (model.v41.vocab)."""
        super().__init__()
        if not config.hc_shifted:
            raise ValueError("hc_shifted = false (an HC head) is not implemented for V4.1")
        self.config = config
        lookup = None
        if config.engram is not None and config.engram.compressed_vocab_size:
            if tokenizer is None or not Path(tokenizer).is_file():
                raise ValueError(
                    "this V4.1 config compresses Engram's vocabulary "
                    f"(engram_compressed_vocab_size): no tokenizer.json at {tokenizer}"
                )
            lookup = torch.tensor(compressed_vocabulary(tokenizer), dtype=torch.long)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            V41Block(config, i, lookup=lookup) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = linear(config.hidden_size, config.vocab_size)
        self.mtp: nn.ModuleList = V41Drafter(config) if config.dspark else nn.ModuleList()
        # The drafter's candidate tokens (model.dspark.read_draft_vocab); None: every token.
        self.draft_vocab: torch.Tensor | None = None
        self.codec = KVCodec(config.head_dim, config.index_head_dim)
        # Decoder SWA bounded replay: prompt tokens the decoder computes (the runner turns it
        # into SeqChunk.decoder_from; 0 = every token).
        self.decoder_keep = env.v41_keep()
        self._rope: RopeTables | None = None
        self._greedy = GreedyArgmax()
        # The vision tower, under its checkpoint names (model.v41.vision); a checkpoint
        # without its tensors drops it (drop_vision) and the model serves text only.
        self.vision_config = VisionConfig.from_dict(config.vision, config.hidden_size)
        if self.vision_config is not None:
            self.vision = VisionTower(self.vision_config)
            self.aligner = Aligner(self.vision_config)
            for name in ("image_start", "image_newline", "image_end"):
                setattr(self, name, nn.Parameter(torch.zeros(config.hidden_size)))

    def drop_vision(self) -> None:
        if self.vision_config is not None:
            del self.vision, self.aligner, self.image_start, self.image_newline, self.image_end
            self.vision_config = None

    def embed_images(self, images: list[tuple[torch.Tensor, int, int]]) -> list[torch.Tensor]:
        """Each image's prompt-span embeddings (model.v41.vision.embed_images)."""
        if self.vision_config is None:
            raise ValueError("this model has no vision tower")
        special = (self.image_start, self.image_newline, self.image_end)
        return embed_images(self.vision, self.aligner, special, images)

    # How many tokens before a chunk's start the forward reads (SeqChunk.context): Engram's
    # longest n-gram reaches max_ngram_size - 1 tokens back.
    @property
    def token_context(self) -> int:
        e = self.config.engram
        return e.max_ngram_size - 1 if e is not None else 0

    def rope_tables(self) -> RopeTables:
        dev = self.head.weight.device
        if self._rope is None or self._rope.main.device != dev:
            self._rope = RopeTables(self.config, dev)
        return self._rope

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    # The names DeepseekV4 has for the token embedding and the LM head (core.drafters).
    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.embed

    @property
    def lm_head(self) -> nn.Module:
        return self.head

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """y: collapsed final hidden rows [R, D] (StepOutput.last)."""
        return self.head(self.norm(y)).float()

    def logits_for(self, y: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        w = self.head.weight.index_select(0, token_ids)
        return torch.nn.functional.linear(self.norm(y), w).float()

    def prepare_greedy_head(self) -> None:
        self._greedy.prepare(self.head.weight)

    def greedy_tokens(self, y: torch.Tensor) -> torch.Tensor:
        return self._greedy(self.norm(y), self.head.weight)

    def _embed(self, batch: ForwardBatch) -> torch.Tensor:
        """The step's input embeddings: token embeddings, and on image rows the chunks' own
        (SeqChunk.embeds; those rows' ids are span ids outside the vocabulary). Sets
        batch.image_mask when the step has image rows."""
        ids = batch.input_ids
        if not any(ch.embeds for ch in batch.chunks):
            return self.embed(ids)
        img = image_rows(ids, self.config.vocab_size)
        x = self.embed(ids.masked_fill(img, 0)).masked_fill(img[:, None], 0.0)
        given = torch.zeros_like(img)
        for ch, off in zip(batch.chunks, batch.layout.offsets, strict=True):
            for row, e in ch.embeds:
                if e.dim() != 2 or e.shape[1] != x.shape[1]:
                    raise ValueError(f"image embeddings must be [rows, {x.shape[1]}]")
                if row < 0 or row + len(e) > len(ch.token_ids):
                    raise ValueError(f"image rows {row}..{row + len(e)} outside the chunk")
                x[off + row : off + row + len(e)] = e.to(x)
                given[off + row : off + row + len(e)] = True
        if not torch.equal(given, img):
            raise ValueError("image embeddings must cover exactly the image tokens of a chunk")
        batch.image_mask = img
        return x

    def ngram_ids(self, batch: ForwardBatch) -> torch.Tensor | None:
        """[T, max_ngram]: column j holds the token j positions back (the pad id before the
        sequence), from each chunk's tokens and its `context`."""
        e = self.config.engram
        if e is None:
            return None
        back = e.max_ngram_size - 1
        rows = []
        for c in batch.chunks:
            need = min(c.start, back)
            if len(c.context) < need:
                raise ValueError(
                    f"a V4.1 chunk starting at {c.start} needs the {need} tokens before it "
                    f"(SeqChunk.context) for Engram, got {len(c.context)}"
                )
            prev = list(c.context[len(c.context) - need :]) if need else []
            seq = [e.pad_token_id] * (back - need) + prev + list(c.token_ids)
            t = torch.tensor(seq, dtype=torch.long)
            # Row i (token i of the chunk) sits at seq[back + i]; column j is j tokens back.
            rows.append(t.unfold(0, back + 1, 1).flip(-1))
        out = torch.cat(rows)
        if bool((out >= self.config.vocab_size).any()):
            # An image token ends the n-gram: it and everything further back read as the pad
            # (DeepInfer's gather_engram_tokens: the image sentinel, then the pad).
            cut = image_rows(out, self.config.vocab_size).cummax(dim=1).values
            out = out.masked_fill(cut, e.pad_token_id)
        return out

    def _enter_decoder(self, h, pre, batch: ForwardBatch, pool: KVCachePool, share: StepShare):
        """At the boundary: the decoder's KV sources pool their main KV from the boundary
        layer's attention input over every row (CED: the decoder's global KV depends only on
        the encoder), then the decoder runs on the rows at or after each chunk's decoder_from
        (bounded replay; their windows start there). Returns the decoder's streams, pre mixes,
        batch (None: no row left), StepShare and the logits rows in its row numbering."""
        c = self.config
        block = self.layers[c.boundary]
        x = block.attn_norm(collapse(pre, h))
        share.shared_hidden = x
        for s in c.kv_source_layer_ids:
            if s >= c.boundary:
                self.layers[s].attn.compress(x, batch, pool.layers[s], share)
        lay = batch.layout
        skip = [
            max(0, min(ch.decoder_from - ch.start, n))
            for ch, n in zip(batch.chunks, lay.lens, strict=True)
        ]
        # Nothing to drop and no window reaching below its floor (decode steps: KEEP >= the
        # window): the decoder runs on the step as it is.
        w = c.sliding_window
        if not any(skip) and all(
            ch.decoder_from <= max(0, ch.start - w + 1) for ch in batch.chunks
        ):
            return h, pre, batch, share, batch.logits_rows
        keep, chunks, floors = [], [], []
        for ch, off, n, k0 in zip(batch.chunks, lay.offsets, lay.lens, skip, strict=True):
            if k0 == n:
                continue
            keep.extend(range(off + k0, off + n))
            chunks.append(dataclasses.replace(ch, token_ids=ch.token_ids[k0:], start=ch.start + k0,
                                              window_floor=0, context=[]))  # fmt: skip
            floors.append(max(ch.window_floor, ch.decoder_from))
        where = {r: i for i, r in enumerate(keep)}
        wanted = batch.logits_rows.tolist()
        if any(r not in where for r in wanted):
            raise ValueError("logits asked for a prompt row before decoder_from (bounded replay)")
        dev = h.device
        rows = torch.tensor([where[r] for r in wanted], dtype=torch.long, device=dev)
        if not keep:
            return h, pre, None, share, rows
        sub = ForwardBatch.build(chunks, batch.rope_tables, batch.block_size, dev)
        if batch.image_mask is not None:
            sub.image_mask = batch.image_mask[keep]
        idx = torch.tensor(keep, dtype=torch.long, device=dev)
        share = StepShare(caches=share.caches, codec=self.codec, shared_hidden=x[idx],
                          floors=floors, taps=share.taps, tapped=share.tapped,
                          rows=idx)  # fmt: skip
        return h[idx], pre[idx], sub, share, rows

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        pool: KVCachePool,
        return_hidden: bool = False,
        greedy: bool = False,
        taps: tuple[int, ...] = (),
    ) -> StepOutput:
        """One step (DeepseekV4.forward's interface). taps: DSpark target layers whose
        attention-input streams, averaged, come back (StepOutput.taps, with `tapped` marking
        the rows that have them: decoder targets skip the rows before decoder_from)."""
        c = self.config
        steps = len(batch.input_ids)
        x = self._embed(batch)
        h = x.unsqueeze(1).expand(-1, c.hc_mult, -1).contiguous()
        # Shifted HC: the first sublayer's input is stream 0 (the embedding itself).
        pre = torch.zeros(h.shape[0], c.hc_mult, dtype=torch.float32, device=h.device)
        pre[:, 0] = 1.0
        share = StepShare(caches=pool.layers, codec=self.codec, taps=taps or None)
        ngram = self.ngram_ids(batch)
        rows = batch.logits_rows
        for i, (layer, cache) in enumerate(zip(self.layers, pool.layers, strict=False)):
            if i == c.boundary:
                h, pre, batch, share, rows = self._enter_decoder(h, pre, batch, pool, share)
                if batch is None:  # no row reaches the decoder (a mid-prompt chunk)
                    break
            h, pre = layer(h, pre, ngram, batch, cache, share)
        y = collapse(pre[rows], h[rows])
        hidden = h if return_hidden else None
        tap, tapped = _gather_taps(taps, share, steps, y, bool(taps) and taps[0] >= c.boundary)
        if greedy:
            tokens = self.greedy_tokens(y)
            masked = self._greedy.masker(self.head.weight)
            return StepOutput(logits=None, hidden=hidden, greedy=tokens, last=y, taps=tap,
                              tapped=tapped, masked_greedy=masked)  # fmt: skip
        return StepOutput(logits=self.logits(y), hidden=hidden, taps=tap, tapped=tapped)


def _gather_taps(taps, share: StepShare, steps: int, like: torch.Tensor, decoder: bool):
    """The step's taps [T, n_taps, D] in its own row numbering and the rows that have them
    ([T] bool; None: all). The targets sit on one side of the decoder boundary (V41Config),
    so they share their rows (decoder: those of share.rows); a step whose rows never reach a
    decoder target has none."""
    if not taps:
        return None, None
    got = [share.tapped.get(i) for i in taps]
    out = like.new_zeros(steps, len(taps), like.shape[-1])
    have = torch.zeros(steps, dtype=torch.bool, device=like.device)
    if all(t is not None for t in got):
        rows = share.rows if decoder else None
        if rows is None:
            out[:] = torch.stack(got, 1).to(out.dtype)
            have[:] = True
        else:
            out[rows] = torch.stack(got, 1).to(out.dtype)
            have[rows] = True
    return out, None if bool(have.all()) else have
