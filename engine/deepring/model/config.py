"""DeepSeek V4 model configuration, parsed from a Hugging Face `config.json`.

Accepts both spellings that exist in the wild: the transformers-native one written by
`DeepseekV4Config.save_pretrained` (`layer_types`, `compress_rates`, `mlp_layer_types`,
`partial_rotary_factor`, nested `rope_parameters`) and the original checkpoint's
(`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, flat `rope_scaling`).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepring.cache.layout import CSA as CACHE_CSA
from deepring.cache.layout import HCA as CACHE_HCA
from deepring.cache.layout import SLIDING as CACHE_SLIDING
from deepring.cache.layout import CacheLayout, LayerLayout, block_multiple

if TYPE_CHECKING:
    import torch

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
HASH_MOE = "hash_moe"
MOE = "moe"
MLP_TYPES = (HASH_MOE, MOE)
SCORING_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")

MODEL_TYPE = "deepseek_v4"
_DEFAULT_RATES = {CSA: 4, HCA: 128}
_CACHE_KIND = {SLIDING: CACHE_SLIDING, CSA: CACHE_CSA, HCA: CACHE_HCA}


@dataclass(frozen=True)
class YarnScaling:
    """YaRN parameters of the compressed-attention RoPE (V4 forces attention_factor = 1)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class DSparkConfig:
    """The DSpark drafter attached to a checkpoint (V4-Flash-DSpark, V4-Flash-0731, V4.1).

    Its `num_stages` draft stages are V4 blocks with sliding-window attention only, stored
    under `mtp.0..` in place of the MTP layer (the checkpoints keep a stale
    num_nextn_predict_layers = 1 beside three stages; the stage count comes from the trailing
    compress_ratios entries). The target's hidden states after `target_layer_ids` (mean over
    the hyper-connection streams) are fused by `mtp.0.main_proj`; a block drafts
    `block_size` tokens from [anchor, noise x (block_size - 1)]."""

    block_size: int
    noise_token_id: int
    target_layer_ids: tuple[int, ...]
    markov_rank: int
    num_stages: int
    # The stages' MoE (V4.1 gives the drafter fewer experts; V4 the backbone's).
    n_routed_experts: int
    num_experts_per_tok: int
    # Sequential temperature scaling of the confidence head, one per draft position (ours:
    # `dspark_confidence_temperatures`; empty = uncalibrated, every temperature 1).
    confidence_temperatures: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
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
    layer_types: tuple[str, ...]
    compress_rates: tuple[tuple[str, int], ...]
    mlp_layer_types: tuple[str, ...]
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn: YarnScaling | None = None
    max_position_embeddings: int = 1048576
    num_nextn_predict_layers: int = 0
    # Attention type of each MTP layer (the trailing compress_ratios entries; sliding when absent).
    mtp_layer_types: tuple[str, ...] = ()
    bos_token_id: int | None = 0
    eos_token_ids: tuple[int, ...] = (1,)
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    # The DSpark drafter; its stages then fill the MTP slots (mtp_layer_types).
    dspark: DSparkConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid DeepSeek V4 config: {msg}")

        need(len(self.layer_types) == self.num_hidden_layers, "len(layer_types) != layers")
        need(len(self.mlp_layer_types) == self.num_hidden_layers, "len(mlp_layer_types) != layers")
        need(
            all(t in LAYER_TYPES for t in self.layer_types), f"layer_types must be in {LAYER_TYPES}"
        )
        need(all(t in MLP_TYPES for t in self.mlp_layer_types), f"mlp types must be in {MLP_TYPES}")
        need(all(t in LAYER_TYPES for t in self.mtp_layer_types), "bad mtp_layer_types")
        need(len(self.mtp_layer_types) == self.num_nextn_predict_layers, "mtp layer count")
        need(self.scoring_func in SCORING_FUNCS, f"scoring_func must be in {SCORING_FUNCS}")
        need(self.rope_head_dim % 2 == 0 and 0 < self.rope_head_dim <= self.head_dim, "rope dim")
        need(self.rope_head_dim <= self.index_head_dim, "rope dim must fit the indexer head")
        need((self.num_attention_heads * self.head_dim) % self.o_groups == 0, "o_groups")
        need(self.num_experts_per_tok <= self.n_routed_experts, "top-k > experts")
        rates = dict(self.compress_rates)
        for t in set(self.layer_types) - {SLIDING}:
            need(rates.get(t, 0) > 0, f"missing compress rate for {t}")
        need(self.hc_mult >= 1 and self.hc_sinkhorn_iters >= 1, "hc settings")
        if self.dspark is not None:
            self._check_dspark(self.dspark, need)

    def _check_dspark(self, ds: DSparkConfig, need) -> None:
        need(ds.block_size >= 1, "dspark_block_size must be >= 1")
        need(0 <= ds.noise_token_id < self.vocab_size, "dspark_noise_token_id outside the vocab")
        ids = ds.target_layer_ids
        need(len(ids) >= 1, "dspark_target_layer_ids is empty")
        need(
            all(0 <= i < self.num_hidden_layers for i in ids)
            and all(a < b for a, b in itertools.pairwise(ids)),
            "dspark_target_layer_ids must be increasing backbone layer ids",
        )
        need(ds.markov_rank >= 0, "dspark_markov_rank must be >= 0")
        need(ds.num_stages >= 1, "a DSpark drafter needs at least one stage")
        need(self.mtp_layer_types == (SLIDING,) * ds.num_stages, "DSpark stages are sliding-only")
        need(0 < ds.num_experts_per_tok <= ds.n_routed_experts, "DSpark experts top-k")
        need(
            not ds.confidence_temperatures
            or (len(ds.confidence_temperatures) == ds.block_size
                and all(t > 0 for t in ds.confidence_temperatures)),
            "dspark_confidence_temperatures: one positive temperature per draft position",
        )  # fmt: skip

    # ---- derived -------------------------------------------------------------------------------

    @property
    def model_type(self) -> str:
        """The checkpoint family, which also names its prompt template (protocol.formats)."""
        return MODEL_TYPE

    def compress_rate(self, layer_type: str) -> int:
        """Tokens per compressed entry (0 for sliding-only layers)."""
        return 0 if layer_type == SLIDING else dict(self.compress_rates)[layer_type]

    @property
    def layer_ratios(self) -> tuple[int, ...]:
        return tuple(self.compress_rate(t) for t in self.layer_types)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def min_block_size(self) -> int:
        """Smallest cache block length every compressed layer divides evenly."""
        return block_multiple(self.layer_ratios)

    def cache_layout(self, dtype: torch.dtype) -> CacheLayout:
        """What this model caches per layer (backbone, then MTP layers), stored as `dtype`."""
        layers = []
        for t in list(self.layer_types) + list(self.mtp_layer_types):
            layers.append(
                LayerLayout(
                    kind=_CACHE_KIND[t],
                    ratio=self.compress_rate(t),
                    head_dim=self.head_dim,
                    index_head_dim=self.index_head_dim if t == CSA else 0,
                )
            )
        return CacheLayout(layers=tuple(layers), window=self.sliding_window, dtype=dtype)

    # ---- (de)serialisation ---------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        if d.get("model_type") == "deepseek_v41":  # V4.1: its own config (model.v41)
            from deepring.model.v41.config import V41Config

            return V41Config.from_hf_dict(d)  # type: ignore[return-value]
        if "text_config" in d and "hidden_size" not in d:
            d = d["text_config"]
        mt = d.get("model_type")
        if mt is not None and mt != MODEL_TYPE:
            raise ValueError(
                f"unsupported model_type {mt!r}: this engine implements {MODEL_TYPE} and "
                "deepseek_v41"
            )
        try:
            n = int(d["num_hidden_layers"])
            head_dim = int(d["head_dim"])
        except KeyError as e:
            raise ValueError(f"config.json lacks required key {e.args[0]!r}") from None

        rates = dict(_DEFAULT_RATES)
        rates.update({k: int(v) for k, v in (d.get("compress_rates") or {}).items()})
        if d.get("compress_rate_csa") is not None:
            rates[CSA] = int(d["compress_rate_csa"])
        if d.get("compress_rate_hca") is not None:
            rates[HCA] = int(d["compress_rate_hca"])
        ratio_to_type = {0: SLIDING, rates[CSA]: CSA, rates[HCA]: HCA}

        ratios = d.get("compress_ratios")
        layer_types = d.get("layer_types")
        if layer_types is None and ratios is not None:
            try:
                layer_types = [ratio_to_type[int(r)] for r in ratios[:n]]
            except KeyError as e:
                raise ValueError(f"compress_ratios holds unsupported ratio {e.args[0]}") from None
        if layer_types is None:  # transformers' default: 2 HCA, then alternating HCA/CSA
            layer_types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
        layer_types = list(layer_types)[:n]

        mlp_types = d.get("mlp_layer_types")
        if mlp_types is None:
            n_hash = d.get("num_hash_layers")
            n_hash = 3 if n_hash is None else int(n_hash)
            mlp_types = [HASH_MOE] * min(n, n_hash) + [MOE] * max(0, n - n_hash)
        mlp_types = list(mlp_types)[:n]

        if d.get("partial_rotary_factor") is not None:
            rope_dim = int(head_dim * float(d["partial_rotary_factor"]))
        elif d.get("qk_rope_head_dim") is not None:
            rope_dim = int(d["qk_rope_head_dim"])
        else:
            rope_dim = head_dim * 64 // 512

        rope_theta = float(d.get("rope_theta", 10000.0))
        compress_theta = float(d.get("compress_rope_theta", 160000.0))
        rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if isinstance(rp.get("compress"), dict):
            comp = rp["compress"]
            main = rp.get("main") or {}
            rope_theta = float(main.get("rope_theta", rope_theta))
            compress_theta = float(comp.get("rope_theta", compress_theta))
        else:
            comp = rp
        yarn = None
        rope_type = comp.get("rope_type", comp.get("type", "default"))
        if rope_type == "yarn":
            factor = comp.get("factor")
            orig = int(comp["original_max_position_embeddings"])
            if factor is None:
                factor = float(d.get("max_position_embeddings", 1048576)) / orig
            yarn = YarnScaling(
                factor=float(factor),
                original_max_position_embeddings=orig,
                beta_fast=float(comp.get("beta_fast") or 32),
                beta_slow=float(comp.get("beta_slow") or 1),
            )
        elif rope_type not in ("default", None):
            raise ValueError(f"unsupported compressed-attention rope_type {rope_type!r}")

        n_mtp = int(d.get("num_nextn_predict_layers") or 0)
        mtp_types = [SLIDING] * n_mtp
        if d.get("mtp_compress_ratios") is not None:
            ratios = [0] * n + list(d["mtp_compress_ratios"])
        if ratios is not None:
            for i in range(n_mtp):
                if n + i < len(ratios):
                    mtp_types[i] = ratio_to_type.get(int(ratios[n + i]), SLIDING)

        dspark = _dspark_from_hf(d, n, ratios, n_mtp)
        if dspark is not None:  # the stages take the MTP slots, whatever num_nextn says
            n_mtp = dspark.num_stages
            tail = list(ratios[n:]) if ratios is not None else []
            if any(int(r) != 0 for r in tail[:n_mtp]):
                raise ValueError("DSpark stages must be sliding-only (compress ratio 0)")
            mtp_types = [SLIDING] * n_mtp

        eos = d.get("eos_token_id", 1)
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        if not isinstance(dtype, str):
            dtype = str(dtype)

        known = {f for f in cls.__dataclass_fields__}
        return cls(
            vocab_size=int(d.get("vocab_size", 129280)),
            hidden_size=int(d["hidden_size"]),
            num_hidden_layers=n,
            num_attention_heads=int(d["num_attention_heads"]),
            head_dim=head_dim,
            rope_head_dim=rope_dim,
            q_lora_rank=int(d["q_lora_rank"]),
            o_groups=int(d.get("o_groups", 8)),
            o_lora_rank=int(d.get("o_lora_rank", 1024)),
            sliding_window=int(d.get("sliding_window", 128)),
            layer_types=tuple(layer_types),
            compress_rates=tuple(sorted(rates.items())),
            mlp_layer_types=tuple(mlp_types),
            n_routed_experts=int(d.get("n_routed_experts", 256)),
            n_shared_experts=int(d.get("n_shared_experts", 1)),
            num_experts_per_tok=int(d.get("num_experts_per_tok", 6)),
            moe_intermediate_size=int(d.get("moe_intermediate_size", 2048)),
            scoring_func=str(d.get("scoring_func", "sqrtsoftplus")),
            routed_scaling_factor=float(d.get("routed_scaling_factor", 1.5)),
            swiglu_limit=float(d.get("swiglu_limit", 10.0)),
            index_n_heads=int(d.get("index_n_heads", 64)),
            index_head_dim=int(d.get("index_head_dim", 128)),
            index_topk=int(d.get("index_topk", 512)),
            hc_mult=int(d.get("hc_mult", 4)),
            hc_sinkhorn_iters=int(d.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(d.get("hc_eps", 1e-6)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            compress_rope_theta=compress_theta,
            yarn=yarn,
            max_position_embeddings=int(d.get("max_position_embeddings", 1048576)),
            num_nextn_predict_layers=n_mtp,
            mtp_layer_types=tuple(mtp_types),
            bos_token_id=None
            if d.get("bos_token_id", 0) is None
            else int(d.get("bos_token_id", 0)),
            eos_token_ids=eos_ids,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            torch_dtype=dtype.replace("torch.", ""),
            dspark=dspark,
            extra={k: v for k, v in d.items() if k not in known and not k.startswith("dspark_")},
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ValueError(f"no config.json at {p}")
        return cls.from_hf_dict(json.loads(p.read_text(encoding="utf-8")))

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that both this parser and transformers' DeepseekV4Config accept."""
        compress: dict[str, Any] = {
            "rope_type": "default",
            "rope_theta": self.compress_rope_theta,
            "partial_rotary_factor": self.rope_head_dim / self.head_dim,
        }
        if self.yarn is not None:
            compress.update(
                rope_type="yarn",
                factor=self.yarn.factor,
                original_max_position_embeddings=self.yarn.original_max_position_embeddings,
                beta_fast=self.yarn.beta_fast,
                beta_slow=self.yarn.beta_slow,
                attention_factor=1.0,
            )
        d = asdict(self)
        for k in ("yarn", "extra", "rope_head_dim", "eos_token_ids", "mtp_layer_types", "dspark"):
            d.pop(k)
        d["dtype"] = d.pop("torch_dtype")
        d.update(
            model_type=MODEL_TYPE,
            architectures=["DeepseekV4ForCausalLM"],
            layer_types=list(self.layer_types),
            mlp_layer_types=list(self.mlp_layer_types),
            compress_rates=dict(self.compress_rates),
            partial_rotary_factor=self.rope_head_dim / self.head_dim,
            rope_parameters={
                "main": {
                    "rope_type": "default",
                    "rope_theta": self.rope_theta,
                    "partial_rotary_factor": self.rope_head_dim / self.head_dim,
                },
                "compress": compress,
            },
            eos_token_id=list(self.eos_token_ids)
            if len(self.eos_token_ids) > 1
            else self.eos_token_id,
            # Our own key: the attention type of each MTP layer (transformers ignores it).
            mtp_compress_ratios=[self.compress_rate(t) for t in self.mtp_layer_types],
        )
        if self.dspark is not None:
            ds = self.dspark
            d.update(
                dspark_block_size=ds.block_size,
                dspark_noise_token_id=ds.noise_token_id,
                dspark_target_layer_ids=list(ds.target_layer_ids),
                dspark_markov_rank=ds.markov_rank,
                dspark_num_stages=ds.num_stages,
                dspark_n_routed_experts=ds.n_routed_experts,
                dspark_num_experts_per_tok=ds.num_experts_per_tok,
            )
            if ds.confidence_temperatures:
                d["dspark_confidence_temperatures"] = list(ds.confidence_temperatures)
        return d


def _dspark_from_hf(
    d: dict[str, Any], n: int, ratios: list | None, n_mtp: int
) -> DSparkConfig | None:
    """The DSpark drafter of a config.json, if it has one (`dspark_block_size` present).

    Stage count: our `dspark_num_stages`, else the compress_ratios entries past the backbone
    (46 - 43 = 3 on V4-Flash-DSpark, whose num_nextn_predict_layers still says 1), else
    num_nextn_predict_layers (V4.1 says 3)."""
    if d.get("dspark_block_size") is None:
        return None
    if d.get("dspark_num_stages") is not None:
        stages = int(d["dspark_num_stages"])
    elif ratios is not None and len(ratios) > n:
        stages = len(ratios) - n
    else:
        stages = n_mtp
    try:
        targets = tuple(int(i) for i in d["dspark_target_layer_ids"])
        noise = int(d["dspark_noise_token_id"])
    except KeyError as e:
        raise ValueError(f"DSpark config.json lacks {e.args[0]!r}") from None
    return DSparkConfig(
        block_size=int(d["dspark_block_size"]),
        noise_token_id=noise,
        target_layer_ids=targets,
        markov_rank=int(d.get("dspark_markov_rank") or 0),
        num_stages=stages,
        n_routed_experts=int(d.get("dspark_n_routed_experts") or d.get("n_routed_experts", 256)),
        num_experts_per_tok=int(
            d.get("dspark_num_experts_per_tok") or d.get("num_experts_per_tok", 6)
        ),
        confidence_temperatures=tuple(
            float(t) for t in d.get("dspark_confidence_temperatures") or ()
        ),
    )
