"""DeepSeek V4.1 configuration from its nested Hugging Face `config.json`.

The checkpoint's config nests the language model under `text_config` beside `vision_config`
and `quantization_config`. Per layer, `compress_ratios` gives 0 (sliding window only), 2 or 1
(CSA2: compressed main KV, one entry per 2 tokens or per token). Only `kv_source_layer_ids` own
main KV, indexer keys and a compressor; every other compressed layer reads the latest source at
or before it. Each compressed layer runs in one of three modes:

- Full: a KV source; computes main KV, indexer keys and its own indexer query, selects top-k;
- Reindex: an index source (`index_source_layer_ids`) that is no KV source; its own indexer
  query over the shared keys (inside the candidate pool once the candidate source has run);
- Reuse: neither; attends to the top-k of the latest index source.

The first ratio-1 layer is the encoder/decoder boundary (DeepInfer's `n_prefill_layer`): the
layers from it on are the decoder, whose KV sources project their main KV from the boundary
layer's normalised attention input (the last encoder layer's output), never from their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepring.cache.layout import CSA2 as CACHE_CSA2
from deepring.cache.layout import SLIDING as CACHE_SLIDING
from deepring.cache.layout import CacheLayout, LayerLayout, block_multiple
from deepring.model.config import DSparkConfig, YarnScaling

if TYPE_CHECKING:
    import torch

MODEL_TYPE = "deepseek_v41"
WINDOW, FULL, REINDEX, REUSE = "window", "full", "reindex", "reuse"
RATIOS = (0, 1, 2)
KV_DTYPES = ("auto", "fp4")


@dataclass(frozen=True)
class EngramConfig:
    """n-gram hash memory at `layer_ids` (all on the encoder side)."""

    layer_ids: tuple[int, ...]
    max_ngram_size: int  # orders 2 .. max_ngram_size
    vocab_sizes: tuple[int, ...]  # per order: the tables' minimum size (primes >= it)
    n_heads: int  # hash heads per order
    head_dim: int  # embedding width per head
    # Size of the compressed vocabulary the hashes run on (0: the token ids themselves).
    compressed_vocab_size: int
    pad_token_id: int  # stands for the tokens before the sequence's first

    @property
    def n_tables(self) -> int:
        return (self.max_ngram_size - 1) * self.n_heads


@dataclass(frozen=True)
class V41Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]  # backbone layers only
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    index_k_source_layer_ids: tuple[int, ...]
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    index_topk: int = 512
    index_n_heads: int = 32
    index_head_dim: int = 128
    candidate_source_layer_id: int | None = None
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    hc_shifted: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn: YarnScaling | None = None
    max_position_embeddings: int = 1048576
    engram: EngramConfig | None = None
    dspark: DSparkConfig | None = None
    num_nextn_predict_layers: int = 0
    bos_token_id: int | None = 0
    eos_token_ids: tuple[int, ...] = (1,)
    pad_token_id: int | None = 2
    image_token_id: int | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    # Main KV and indexer keys stored FP4 (the checkpoint's `use_fp4_sparse_kv`); the engine
    # stores them in the pool's dtype unless the cache dtype option asks for FP4.
    use_fp4_sparse_kv: bool = True
    vision: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    quantization: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid DeepSeek V4.1 config: {msg}")

        n = self.num_hidden_layers
        need(len(self.compress_ratios) == n, "compress_ratios must cover every backbone layer")
        need(all(r in RATIOS for r in self.compress_ratios), f"compress ratios must be in {RATIOS}")
        need(self.rope_head_dim % 2 == 0 and 0 < self.rope_head_dim <= self.head_dim, "rope dim")
        need(self.rope_head_dim <= self.index_head_dim, "rope dim must fit the indexer head")
        need(self.num_attention_heads % self.o_groups == 0, "o_groups must divide the heads")
        need(0 < self.num_experts_per_tok <= self.n_routed_experts, "experts top-k")
        need(self.scoring_func == "sqrtsoftplus", "scoring_func must be sqrtsoftplus")
        need(self.index_topk >= 1, "index_topk must be >= 1")
        kv, ik, ix = (
            self.kv_source_layer_ids,
            self.index_k_source_layer_ids,
            self.index_source_layer_ids,
        )
        for name, ids in (("kv", kv), ("index_k", ik), ("index", ix)):
            need(list(ids) == sorted(set(ids)), f"{name}_source_layer_ids must be increasing")
            need(all(0 <= i < n and self.compress_ratios[i] for i in ids),
                 f"{name}_source_layer_ids must name compressed backbone layers")  # fmt: skip
        # Segments nest: a KV segment starts an index-K one, which starts an index one.
        need(set(kv) <= set(ik) <= set(ix), "sources must nest: kv within index_k within index")
        compressed = [i for i, r in enumerate(self.compress_ratios) if r]
        if compressed:
            need(bool(kv) and kv[0] == compressed[0], "the first compressed layer must own KV")
        for i in compressed:
            src = self.kv_source(i)
            need(self.compress_ratios[src] == self.compress_ratios[i],
                 f"layer {i} has ratio {self.compress_ratios[i]} but its KV source {src} has "
                 f"ratio {self.compress_ratios[src]}")  # fmt: skip
        # (The decoder's first layer is then a KV source: it is the first ratio-1 layer, and
        # its source must have its ratio.)
        b = self.boundary
        if self.candidate_source_layer_id is not None:
            c = self.candidate_source_layer_id
            need(c in ix, "candidate_source_layer_id must be an index source")
            need(self.candidate_topk_blocks >= 1 and self.candidate_block_size >= 1,
                 "candidate_topk_blocks and candidate_block_size must be >= 1")  # fmt: skip
            need(self.candidate_topk_blocks * self.candidate_block_size >= self.index_topk,
                 "the candidate pool must hold at least index_topk entries")  # fmt: skip
        need(self.hc_mult >= 1 and self.hc_sinkhorn_iters >= 1, "hc settings")
        if self.engram is not None:
            e = self.engram
            need(e.max_ngram_size >= 2 and e.n_heads >= 1 and e.head_dim >= 1, "engram sizes")
            need(len(e.vocab_sizes) == e.max_ngram_size - 1, "one engram vocab size per order")
            need(all(0 <= i < b for i in e.layer_ids), "engram layers must be encoder layers")
        if self.dspark is not None:
            t = self.dspark.target_layer_ids
            need(bool(t) and all(0 <= i < n for i in t), "dspark targets")
            # (DeepInfer's constraint: a decoder target's taps exist only for the decoder's
            # rows, an encoder target's for every row; mixed, they would not line up.)
            need(len({i >= self.boundary for i in t}) == 1,
                 "dspark targets must all be encoder layers or all decoder layers")  # fmt: skip

    # ---- derived ---------------------------------------------------------------------------

    @property
    def model_type(self) -> str:
        return MODEL_TYPE

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def boundary(self) -> int:
        """The first decoder layer (the first ratio-1 layer; all layers if there is none)."""
        return next(
            (i for i, r in enumerate(self.compress_ratios) if r == 1), self.num_hidden_layers
        )

    @staticmethod
    def _latest(ids: tuple[int, ...], layer: int) -> int:
        return max(i for i in ids if i <= layer)

    def kv_source(self, layer: int) -> int:
        return self._latest(self.kv_source_layer_ids, layer)

    def index_k_source(self, layer: int) -> int:
        return self._latest(self.index_k_source_layer_ids, layer)

    def index_source(self, layer: int) -> int:
        return self._latest(self.index_source_layer_ids, layer)

    def mode(self, layer: int) -> str:
        if not self.compress_ratios[layer]:
            return WINDOW
        if layer in self.kv_source_layer_ids:
            return FULL
        return REINDEX if layer in self.index_source_layer_ids else REUSE

    def candidate_restricted(self, layer: int) -> bool:
        """Whether this layer's indexer scores only the candidate pool (an index source after
        the candidate source)."""
        c = self.candidate_source_layer_id
        return c is not None and layer > c and layer in self.index_source_layer_ids

    def min_block_size(self) -> int:
        return block_multiple(self.compress_ratios)

    def cache_layout(self, dtype: torch.dtype, fp4: bool | None = None) -> CacheLayout:
        """Per backbone layer: a sliding-window ring; KV sources also their paged main KV and
        indexer keys (and, at ratio 2, the compressor's tail). Then one window ring per DSpark
        stage (its context K=V rows: core.drafters.DSparkContext). fp4: main KV and indexer
        keys stored FP4 (None: as DEEPRING_V41_KV_CACHE says)."""
        if fp4 is None:
            from deepring import env

            fp4 = env.v41_kv_cache() == "fp4"
        layers = []
        for i, r in enumerate(self.compress_ratios):
            if self.mode(i) == FULL:
                layers.append(
                    LayerLayout(CACHE_CSA2, r, self.head_dim, self.index_head_dim, fp4=fp4)
                )
            else:
                layers.append(LayerLayout(CACHE_SLIDING, 0, self.head_dim))
        stages = self.dspark.num_stages if self.dspark is not None else 0
        layers += [LayerLayout(CACHE_SLIDING, 0, self.head_dim)] * stages
        return CacheLayout(layers=tuple(layers), window=self.sliding_window, dtype=dtype)

    def global_kv_bytes_per_token(self, fp4: bool = True, elem_bytes: int = 2) -> float:
        """Bytes of main KV + indexer keys per token over the KV-source layers: FP4 entries are
        E2M1 with an E4M3 scale per 16 channels (main) or an E8M0 scale per 32 (indexer)."""
        if fp4:
            main = self.head_dim // 2 + self.head_dim // 16
            index = self.index_head_dim // 2 + self.index_head_dim // 32
        else:
            main, index = self.head_dim * elem_bytes, self.index_head_dim * elem_bytes
        return sum((main + index) / self.compress_ratios[i] for i in self.kv_source_layer_ids)

    # ---- parsing ---------------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> V41Config:
        if d.get("model_type") != MODEL_TYPE:
            raise ValueError(f"not a {MODEL_TYPE} config (model_type {d.get('model_type')!r})")
        t = d.get("text_config")
        if not isinstance(t, dict):
            raise ValueError("a deepseek_v41 config.json needs a text_config object")
        # The runtime's fixed choices, refused rather than silently misread.
        for key, want in (("hidden_act", "silu"), ("attention_bias", False),
                          ("num_key_value_heads", 1), ("norm_topk_prob", True),
                          ("topk_method", "noaux_tc")):  # fmt: skip
            if key in t and t[key] != want:
                raise ValueError(f"text_config.{key} = {t[key]!r}: only {want!r} is supported")
        q = d.get("quantization_config") or {}
        if q and q.get("quant_method") not in (None, "fp8"):
            raise ValueError(f"quantization_config.quant_method {q.get('quant_method')!r}")

        def req(key: str) -> Any:
            if key not in t:
                raise ValueError(f"text_config lacks required key {key!r}")
            return t[key]

        n = int(req("num_hidden_layers"))
        ratios = [int(r) for r in req("compress_ratios")]
        if len(ratios) < n:
            raise ValueError(f"compress_ratios has {len(ratios)} entries for {n} layers")
        kv = tuple(int(i) for i in req("kv_source_layer_ids"))
        ix = tuple(int(i) for i in t.get("index_source_layer_ids") or kv)
        ik = tuple(int(i) for i in t.get("index_k_source_layer_ids") or kv)
        yarn = None
        rs = t.get("rope_scaling")
        if rs:
            yarn = YarnScaling(
                factor=float(rs["factor"]),
                original_max_position_embeddings=int(rs["original_max_position_embeddings"]),
                beta_fast=float(rs.get("beta_fast") or 32),
                beta_slow=float(rs.get("beta_slow") or 1),
            )
        n_mtp = int(t.get("num_nextn_predict_layers") or 0)
        dspark = None
        if t.get("dspark_block_size") is not None:
            dspark = DSparkConfig(
                block_size=int(t["dspark_block_size"]),
                noise_token_id=int(req("dspark_noise_token_id")),
                target_layer_ids=tuple(int(i) for i in req("dspark_target_layer_ids")),
                markov_rank=int(t.get("dspark_markov_rank") or 0),
                num_stages=n_mtp,
                n_routed_experts=int(t.get("dspark_n_routed_experts") or req("n_routed_experts")),
                num_experts_per_tok=int(
                    t.get("dspark_num_experts_per_tok") or req("num_experts_per_tok")
                ),
            )
        engram = None
        if t.get("engram_layer_ids"):
            orders = int(req("engram_max_ngram_size"))
            vs = req("engram_vocab_size")
            vs = [int(v) for v in vs] if isinstance(vs, list) else [int(vs)] * (orders - 1)
            engram = EngramConfig(
                layer_ids=tuple(int(i) for i in t["engram_layer_ids"]),
                max_ngram_size=orders,
                vocab_sizes=tuple(vs),
                n_heads=int(req("engram_n_heads")),
                head_dim=int(req("engram_head_dim")),
                compressed_vocab_size=int(t.get("engram_compressed_vocab_size") or 0),
                pad_token_id=int(t.get("engram_pad_token_id", d.get("pad_token_id", 2))),
            )
        eos = d.get("eos_token_id", t.get("eos_token_id", 1))
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        dtype = str(d.get("dtype") or d.get("torch_dtype") or "bfloat16").replace("torch.", "")
        cand = t.get("candidate_source_layer_id")
        bos = d.get("bos_token_id", t.get("bos_token_id", 0))
        pad = d.get("pad_token_id", t.get("pad_token_id", 2))
        return cls(
            vocab_size=int(req("vocab_size")),
            hidden_size=int(req("hidden_size")),
            num_hidden_layers=n,
            num_attention_heads=int(req("num_attention_heads")),
            head_dim=int(req("head_dim")),
            rope_head_dim=int(req("qk_rope_head_dim")),
            q_lora_rank=int(req("q_lora_rank")),
            o_groups=int(req("o_groups")),
            o_lora_rank=int(req("o_lora_rank")),
            sliding_window=int(req("sliding_window")),
            compress_ratios=tuple(ratios[:n]),
            kv_source_layer_ids=kv,
            index_source_layer_ids=ix,
            index_k_source_layer_ids=ik,
            n_routed_experts=int(req("n_routed_experts")),
            n_shared_experts=int(t.get("n_shared_experts", 1)),
            num_experts_per_tok=int(req("num_experts_per_tok")),
            moe_intermediate_size=int(req("moe_intermediate_size")),
            index_topk=int(req("index_topk")),
            index_n_heads=int(req("index_n_heads")),
            index_head_dim=int(req("index_head_dim")),
            candidate_source_layer_id=None if cand is None else int(cand),
            candidate_topk_blocks=int(t.get("candidate_topk_blocks") or 0),
            candidate_block_size=int(t.get("candidate_block_size") or 0),
            scoring_func=str(t.get("scoring_func", "sqrtsoftplus")),
            routed_scaling_factor=float(t.get("routed_scaling_factor", 1.5)),
            swiglu_limit=float(t.get("swiglu_limit", 10.0)),
            hc_mult=int(t.get("hc_mult", 4)),
            hc_sinkhorn_iters=int(t.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(t.get("hc_eps", 1e-6)),
            hc_shifted=bool(t.get("hc_shifted", True)),
            rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
            rope_theta=float(t.get("rope_theta", 10000.0)),
            compress_rope_theta=float(t.get("compress_rope_theta", 160000.0)),
            yarn=yarn,
            max_position_embeddings=int(t.get("max_position_embeddings", 1048576)),
            engram=engram,
            dspark=dspark,
            num_nextn_predict_layers=n_mtp,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=eos_ids,
            pad_token_id=None if pad is None else int(pad),
            image_token_id=None if d.get("image_token_id") is None else int(d["image_token_id"]),
            tie_word_embeddings=bool(t.get("tie_word_embeddings", False)),
            torch_dtype=dtype,
            use_fp4_sparse_kv=bool(t.get("use_fp4_sparse_kv", True)),
            vision=dict(d.get("vision_config") or {}),
            quantization=dict(q),
        )


def next_prime(n: int) -> int:
    """The smallest prime > n (trial division: table sizes are at most a few hundred million,
    and there are a few dozen tables)."""
    c = n + 1
    while True:
        if c >= 2 and all(c % p for p in range(2, math.isqrt(c) + 1)):
            return c
        c += 1


def engram_table_sizes(cfg: EngramConfig) -> dict[int, list[list[int]]]:
    """Per Engram layer, per n-gram order, per hash head: the table's row count. Distinct
    primes across every layer and head, in config order, each order's heads chaining upward
    from its vocab size (the layout DeepInfer's table ids assume)."""
    seen: set[int] = set()
    out: dict[int, list[list[int]]] = {}
    for layer in cfg.layer_ids:
        per_order = []
        for vocab in cfg.vocab_sizes:
            start, sizes = vocab - 1, []
            for _ in range(cfg.n_heads):
                p = next_prime(start)
                while p in seen:
                    p = next_prime(p)
                seen.add(p)
                sizes.append(p)
                start = p
            per_order.append(sizes)
        out[layer] = per_order
    return out
