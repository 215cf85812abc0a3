"""The DeepSeek V4 causal LM over serving caches.

Parameter names follow transformers' `DeepseekV4ForCausalLM` (`model.layers.N.self_attn...`,
`lm_head.weight`), so a `save_pretrained` checkpoint loads as it is; MTP layers, or a DSpark
drafter's stages (model.dspark.DSparkDrafter), live under `mtp.N.` (transformers skips those
keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from deepring.cache.pool import KVCachePool
from deepring.kernels.greedy_head import GreedyArgmax, MaskedGreedy
from deepring.model.batch import ForwardBatch
from deepring.model.config import ModelConfig
from deepring.model.dspark import DSparkDrafter
from deepring.model.hc import HyperHead
from deepring.model.layer import DecoderLayer
from deepring.model.linear import linear
from deepring.model.mtp import MTPLayer
from deepring.model.norm import RMSNorm
from deepring.model.rope import RopeTables


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # Built on the meta device (loader): an initial weight skips Embedding's normal_ init,
        # whose meta-device path imports torch._dynamo (~1.5-3 s of every worker's start-up:
        # ad-hoc cProfile of a worker's build on the 2-core dev machine).
        self.embed_tokens = nn.Embedding(
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size),
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, lt, mt)
            for lt, mt in zip(config.layer_types, config.mlp_layer_types, strict=True)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hc_head = HyperHead(
            config.hc_mult, config.hidden_size, config.hc_eps, config.rms_norm_eps
        )


@dataclass
class StepOutput:
    logits: torch.Tensor | None  # [R, vocab] fp32, rows = batch.logits_rows (None if greedy)
    hidden: torch.Tensor | None = None  # [T, hc, D] final streams (for MTP), when requested
    greedy: torch.Tensor | None = None  # [R] argmax token ids, when asked for instead of logits
    # [R, hc, D] the logits rows' final streams, with greedy (`DeepseekV4.logits` of a few of
    # them is what a constrained row whose argmax the grammar refuses needs)
    last: torch.Tensor | None = None
    # [T, n_taps, D] the mean of the streams at each asked-for layer (a DSpark drafter's
    # context: V4 after the layer, V4.1 at its attention input), when requested
    taps: torch.Tensor | None = None
    # [T] bool: the rows `taps` holds (None: every row; V4.1's decoder skips some)
    tapped: torch.Tensor | None = None
    # With greedy, where the low-precision greedy head ran: its approximate logits, which
    # settle rows whose argmax a grammar refuses again under its mask or its matcher
    # (kernels.greedy_head.MaskedGreedy)
    masked_greedy: MaskedGreedy | None = None


class DeepseekV4(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = linear(config.hidden_size, config.vocab_size)
        # The MTP slots hold either MTP layers or, on a DSpark checkpoint, the draft stages.
        self.mtp: nn.ModuleList = (
            DSparkDrafter(config)
            if config.dspark is not None
            else nn.ModuleList(MTPLayer(config, lt) for lt in config.mtp_layer_types)
        )
        self._rope: RopeTables | None = None
        self._greedy = GreedyArgmax()
        # The DSpark drafter's candidate tokens, most frequent first (model.dspark
        # read_draft_vocab: the checkpoint's draft_vocab.json); None: the whole vocabulary.
        self.draft_vocab: torch.Tensor | None = None

    def rope_tables(self) -> RopeTables:
        dev = self.lm_head.weight.device
        if self._rope is None or self._rope.main.device != dev:
            self._rope = RopeTables(self.config, dev)
        return self._rope

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        y = self.model.norm(self.model.hc_head(h))
        return self.lm_head(y).float()

    def logits_for(self, h: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """The logits of only `token_ids` ([k]) for rows h ([n, hc, D]): [n, k] fp32 (a few
        allowed tokens of a constrained row cost a sliver of the whole vocabulary's head)."""
        y = self.model.norm(self.model.hc_head(h))
        return torch.nn.functional.linear(y, self.lm_head.weight.index_select(0, token_ids)).float()

    def prepare_greedy_head(self) -> None:
        """Build the greedy head's low-precision weight copy now, not in the first greedy step."""
        self._greedy.prepare(self.lm_head.weight)

    def greedy_tokens(self, h: torch.Tensor) -> torch.Tensor:
        """argmax of the logits (first maximum), without materialising the whole logits matrix."""
        y = self.model.norm(self.model.hc_head(h))
        return self._greedy(y, self.lm_head.weight)

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        pool: KVCachePool,
        return_hidden: bool = False,
        greedy: bool = False,
        taps: tuple[int, ...] = (),
    ) -> StepOutput:
        """One step. `greedy=True` returns the argmax tokens of the logits rows instead of the
        logits (cheaper: the logits never exist in full). taps: layers whose output streams,
        averaged, come back for every row (StepOutput.taps)."""
        if any(ch.embeds for ch in batch.chunks):
            raise ValueError("DeepSeek V4 has no vision tower: a chunk carries image embeddings")
        ids = batch.input_ids
        x = self.model.embed_tokens(ids)
        h = x.unsqueeze(1).expand(-1, self.config.hc_mult, -1).contiguous()
        tapped = {}
        for i, (layer, cache) in enumerate(zip(self.model.layers, pool.layers, strict=False)):
            h = layer(h, ids, batch, cache)
            if i in taps:
                tapped[i] = h.mean(1)
        last = h[batch.logits_rows]
        hidden = h if return_hidden else None
        tap = torch.stack([tapped[i] for i in taps], 1) if taps else None
        if greedy:
            tokens = self.greedy_tokens(last)
            return StepOutput(
                logits=None, hidden=hidden, greedy=tokens, last=last, taps=tap,
                masked_greedy=self._greedy.masker(self.lm_head.weight),
            )  # fmt: skip
        return StepOutput(logits=self.logits(last), hidden=hidden, taps=tap)

    @torch.inference_mode()
    def mtp_forward(
        self, batch: ForwardBatch, pool: KVCachePool, hidden: torch.Tensor, depth: int = 0
    ) -> StepOutput:
        """Draft logits from MTP layer `depth`.

        `batch` has the positions, slots and blocks of a backbone step but each row's token is
        the *next* token (the one the backbone sampled or the prompt continues with); `hidden`
        is that backbone step's final streams (StepOutput.hidden). Row i then predicts the
        token two positions after its position. The MTP layer keeps its own window ring.
        """
        if self.config.dspark is not None:
            raise ValueError("this model's MTP slots hold a DSpark drafter, not MTP layers")
        if depth >= len(self.mtp):
            raise ValueError(f"this model has {len(self.mtp)} MTP layers, asked for {depth}")
        layer = self.mtp[depth]
        cache = pool.layers[self.config.num_hidden_layers + depth]
        ids = batch.input_ids
        h = layer.forward_mtp(hidden, self.model.embed_tokens(ids), ids, batch, cache)
        y = layer.collapse(h[batch.logits_rows])
        return StepOutput(logits=self.lm_head(y).float(), hidden=h)
