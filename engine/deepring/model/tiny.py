"""The embedded default model `tiny`: a V4 small enough for two CPU cores with every part of the
architecture present (sliding, CSA and HCA layers; hash-routed and learned-routed MoE; an MTP
layer). Weights are seeded random (see model.dummy), created on first use and cached as
safetensors under $DEEPRING_CACHE_DIR/tiny-<hash>/ together with the V4.1 tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from deepring import env
from deepring.model.config import CSA, HASH_MOE, HCA, MOE, SLIDING, ModelConfig
from deepring.protocol.tokenizer import write_v41_tokenizer

TINY_SEED = 0
# Bump when the generator below changes, so stale caches are not reused.
TINY_FORMAT = 1

TINY_CONFIG: dict = {
    "model_type": "deepseek_v4",
    "architectures": ["DeepseekV4ForCausalLM"],
    "vocab_size": 129281,  # the V4.1 tokenizer: 129280 V4 ids + <｜System｜>
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "partial_rotary_factor": 0.25,
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 32,
    "sliding_window": 128,
    "layer_types": [SLIDING, CSA, HCA, CSA],
    "compress_rates": {CSA: 4, HCA: 128},
    "mlp_layer_types": [HASH_MOE, MOE, MOE, MOE],
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "index_n_heads": 8,
    "index_head_dim": 32,
    "index_topk": 64,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "compress": {
            "rope_type": "yarn",
            "rope_theta": 160000.0,
            "partial_rotary_factor": 0.25,
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
            "attention_factor": 1.0,
        },
    },
    "max_position_embeddings": 1048576,
    "num_nextn_predict_layers": 1,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}


def tiny_config() -> ModelConfig:
    return ModelConfig.from_hf_dict(TINY_CONFIG)


def _fingerprint() -> str:
    blob = json.dumps([TINY_CONFIG, TINY_SEED, TINY_FORMAT], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def tiny_model_dir(cache_dir: Path | None = None) -> Path:
    """The cached tiny checkpoint directory, created on first use (atomically)."""
    root = cache_dir if cache_dir is not None else env.cache_dir()
    return cached_checkpoint(root, f"tiny-{_fingerprint()}", _write_tiny)


def cached_checkpoint(root: Path, name: str, write: Callable[[Path], None]) -> Path:
    """root/name, a checkpoint directory (model.safetensors + tokenizer.json) that `write`
    fills on first use: written into a temporary directory and renamed into place, so
    concurrent first uses never see a partial one."""
    out = root / name
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        write(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process won the race: keep its copy
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_tiny(path: Path) -> None:
    from deepring.model.dummy import init_dummy_weights
    from deepring.model.model import DeepseekV4
    from deepring.model.weights import save_checkpoint

    config = tiny_config()
    with torch.device("meta"):
        model = DeepseekV4(config)
    model.to_empty(device="cpu")
    init_dummy_weights(model, TINY_SEED)
    save_checkpoint(model, path, TINY_CONFIG, dtype=torch.bfloat16)
    write_v41_tokenizer(path / "tokenizer.json")
