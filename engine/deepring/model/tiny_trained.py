"""The embedded trained model `tiny-trained`: a V4 the size of `tiny` (sliding, CSA and HCA
layers, hash and learned MoE), trained on the Python standard library's sources, with a DSpark
drafter in its MTP slots (as DeepSeek-V4-Flash-DSpark ships one), trained with the target
frozen. tools/train_tiny.py produces it; docs/tiny-trained.md says how and what came out.

What ships (model/data/tiny_trained.safetensors, a few MB) is every trained tensor in bf16 (the
hyper-connection mixes and other fp32-kept tensors in fp32). The embedding, the LM head and the
hash-routing table are frozen during training and regenerated here from a seed and the list of
the tokens the corpus uses, by frequency (`lm_head.vocab`: see frozen_tensors), so they are not
shipped (the embedding and head alone are 33M parameters); a digest of them, taken when the
model was trained, must match what this torch generates, or loading refuses. The Markov head
ships only its rows for the tokens training used (`markov_head.vocab`); the others are zero, as
they were in training. The first use assembles a plain checkpoint directory (config.json,
model.safetensors, tokenizer.json) under $DEEPRING_CACHE_DIR/tiny-trained-<hash>/.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from deepring import env
from deepring.model.config import HASH_MOE, ModelConfig
from deepring.model.dspark import DRAFT_VOCAB_FILE
from deepring.model.tiny import TINY_CONFIG, cached_checkpoint
from deepring.protocol.tokenizer import write_v41_tokenizer

NAME = "tiny-trained"
WEIGHTS = Path(__file__).parent / "data" / "tiny_trained.safetensors"
# Bump when the assembly below changes, so stale caches are not reused.
ASSEMBLY_FORMAT = 2  # 2: draft_vocab.json
SHIPPED_FORMAT = "deepring-tiny-trained/1"
# The shipped list of the tokens whose LM head rows are not zero, most frequent first.
HEAD_VOCAB = "lm_head.vocab"

# `tiny`'s shape with its MTP layer replaced by a three-stage DSpark drafter (block 5, like
# V4-Flash-DSpark) whose stages have 4 experts (V4.1 gives its drafter fewer experts too).
BASE_CONFIG: dict = {
    **{k: v for k, v in TINY_CONFIG.items() if k != "num_nextn_predict_layers"},
    "num_nextn_predict_layers": 3,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,  # V4's mask token, as the real drafter uses
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 16,
    "dspark_num_stages": 3,
    "dspark_n_routed_experts": 4,
    "dspark_num_experts_per_tok": 2,
}


def frozen_tensors(config: ModelConfig, seed: int, vocab: torch.Tensor) -> dict[str, torch.Tensor]:
    """The embedding, the LM head and each hash layer's tid2eid (top_k distinct experts per
    token), from `seed` and `vocab`: the tokens the training corpus uses, most frequent first.
    Values are bf16-exact, so the bf16 checkpoint holds exactly what training saw.

    Embedding rows: N(0, 1). Head row of a vocabulary token of frequency rank k:
    r + 2 u - 0.2 ln(1 + k) v, with r ~ N(0, 4/D) per token and u, v two fixed orthonormal
    directions; every other row is zero. Why not plain random rows, measured with the best
    single hidden vector against the corpus's unigram distribution (entropy 6.9 nats): with
    random rows the best is 10.6 nats, with this head 7.9. Zero rows score every hidden state 0,
    where a random row would score some unseen token high at random that no training could push
    down; u lets the model outbid the lump of 110k zero-scored tokens (ln 110k ~ 11.6 nats) all
    at once; v lets it express the Zipf-like prior over frequency ranks that random rows cannot
    (a frozen head cannot learn which tokens are common)."""
    gen = torch.Generator().manual_seed(seed)
    v, d = config.vocab_size, config.hidden_size
    vocab = vocab.long()
    embed = torch.randn(v, d, generator=gen)
    rows = torch.randn(v, d, generator=gen) * 2 * d**-0.5
    u = torch.randn(d, generator=gen)
    u = u / u.norm()
    w = torch.randn(d, generator=gen)
    # The dot product in float64, rounded once: a float32 `w @ u` goes through the BLAS, whose
    # summation order depends on the CPU (MKL on an Intel Xeon rounds it differently from the
    # AMD EPYC that trained the shipped weights, and the digest below then refused them). The
    # float64 dot rounds to what the training run's float32 dot gave.
    w = w - (w.double() @ u.double()).float() * u
    w = w / w.norm()
    rank = torch.arange(vocab.numel(), dtype=torch.float32)
    head = torch.zeros(v, d)
    head[vocab] = rows[vocab] + 2 * u - 0.2 * torch.log1p(rank)[:, None] * w
    out = {
        "model.embed_tokens.weight": embed.bfloat16().float(),
        "lm_head.weight": head.bfloat16().float(),
    }
    for i, kind in enumerate(config.mlp_layer_types):
        if kind == HASH_MOE:
            scores = torch.rand(v, config.n_routed_experts, generator=gen)
            ids = scores.argsort(-1)[:, : config.num_experts_per_tok]
            out[f"model.layers.{i}.mlp.gate.tid2eid"] = ids.to(torch.long)
    return out


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def pack(
    state: dict[str, torch.Tensor], config: ModelConfig, head_vocab: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The shipped form of a full state dict: frozen tensors dropped (the head's vocabulary
    kept), the Markov head cut to its non-zero rows (listed in `mtp.<last>.markov_head.vocab`)."""
    frozen = set(frozen_tensors_names(config))
    out = {k: v for k, v in state.items() if k not in frozen}
    out[HEAD_VOCAB] = head_vocab.to(torch.int32)
    prefix = _markov_prefix(config)
    embed, head = out.pop(prefix + "embed.weight"), out.pop(prefix + "head.weight")
    rows = torch.nonzero((embed != 0).any(-1) | (head != 0).any(-1)).flatten()
    out[prefix + "vocab"] = rows.to(torch.int32)
    out[prefix + "embed.rows"] = embed[rows]
    out[prefix + "head.rows"] = head[rows]
    return out


def unpack(shipped: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The trained tensors of a shipped file, Markov head back at full vocabulary size."""
    out = dict(shipped)
    prefix = _markov_prefix(config)
    rows = out.pop(prefix + "vocab").long()
    for leaf in ("embed", "head"):
        part = out.pop(f"{prefix}{leaf}.rows")
        full = torch.zeros(config.vocab_size, part.shape[1], dtype=part.dtype)
        full[rows] = part
        out[f"{prefix}{leaf}.weight"] = full
    return out


def frozen_tensors_names(config: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "lm_head.weight"]
    return names + [
        f"model.layers.{i}.mlp.gate.tid2eid"
        for i, kind in enumerate(config.mlp_layer_types)
        if kind == HASH_MOE
    ]


def _markov_prefix(config: ModelConfig) -> str:
    if config.dspark is None:
        raise ValueError("tiny-trained needs its DSpark drafter in the config")
    return f"mtp.{config.dspark.num_stages - 1}.markov_head."


def read_shipped(path: Path = WEIGHTS) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The shipped tensors and the file's metadata (format, config, seed, frozen digest)."""
    from safetensors import safe_open

    if not path.is_file():
        raise ValueError(f"{path} is missing: run tools/train_tiny.py to produce it")
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a mapping)
    if meta.get("format") != SHIPPED_FORMAT:
        raise ValueError(f"{path} is not a {SHIPPED_FORMAT} file (format {meta.get('format')!r})")
    return tensors, meta


def tiny_trained_model_dir(cache_dir: Path | None = None, weights: Path = WEIGHTS) -> Path:
    """The assembled checkpoint directory, created on first use (atomically)."""
    blob = weights.read_bytes() if weights.is_file() else b""
    key = hashlib.sha256(blob + f"/{ASSEMBLY_FORMAT}".encode()).hexdigest()[:12]
    root = cache_dir if cache_dir is not None else env.cache_dir()
    return cached_checkpoint(root, f"{NAME}-{key}", lambda path: _assemble(path, weights))


def _assemble(path: Path, weights: Path) -> None:
    from safetensors.torch import save_file

    shipped, meta = read_shipped(weights)
    config_dict = json.loads(meta["config"])
    config = ModelConfig.from_hf_dict(config_dict)
    head_vocab = shipped.pop(HEAD_VOCAB)
    frozen = frozen_tensors(config, int(meta["seed"]), head_vocab)
    if digest(frozen) != meta["frozen_digest"]:
        raise ValueError(
            "this torch generates other seeded embeddings than the run that trained "
            f"{weights.name} did (digest mismatch): retrain with tools/train_tiny.py"
        )
    tensors = unpack(shipped, config)
    for name, t in frozen.items():
        tensors[name] = t if not t.is_floating_point() else t.bfloat16()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config_dict, indent=2), encoding="utf-8")
    # The drafter proposes from the tokens the corpus uses (most frequent first): every other
    # head row is zero, so the target scores those tokens 0 whatever the context, and drafting
    # them was vocabulary-wide work for drafts that are never its argmax.
    (path / DRAFT_VOCAB_FILE).write_text(json.dumps(head_vocab.tolist()), encoding="utf-8")
    write_v41_tokenizer(path / "tokenizer.json")
