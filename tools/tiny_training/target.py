"""The target (backbone), trained through transformers' DeepseekV4ForCausalLM.

Why transformers and not a training forward of our own: it is the reference implementation of V4
(compressors, indexer, hash routing, hyper-connections), autograd runs through it as it is, and
the engine is already tested to compute the same logits as it on the same weights
(tests/engine/test_model_vs_transformers.py); so the trained weights mean in the engine what they
meant in training, with no second implementation of the backbone to keep in step. The cost is
speed: its per-expert loops and eager attention make a step slower than a fused one would be.

The embedding, the LM head and the hash-routing tables are frozen at their seeded values
(model.tiny_trained.frozen_tensors), the head's rows zero outside the corpus vocabulary. So every
token the corpus never uses scores exactly 0, and the full-vocabulary softmax is exact and cheap:
the corpus vocabulary's logits plus one lump of ln(unseen count) standing for all the others.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from deepring.model.config import ModelConfig
from deepring.model.weights import keep_fp32


def hf_model(config: ModelConfig, frozen: dict[str, torch.Tensor], seed: int):
    """transformers' V4 with transformers' own initialisation (seeded), the frozen tensors
    set and excluded from training."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    d = config.to_hf_dict()
    for k in ("architectures", "model_type", "mtp_compress_ratios"):
        d.pop(k, None)
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**d))
    state = model.state_dict()
    with torch.no_grad():
        for name, t in frozen.items():
            state[name].copy_(t)
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    return model


class Support:
    """The LM head's non-zero rows (the corpus vocabulary) and the lump of all the others."""

    def __init__(self, vocab: torch.Tensor, vocab_size: int) -> None:
        self.vocab = vocab
        index = torch.full((vocab_size,), vocab.numel(), dtype=torch.long)
        index[vocab] = torch.arange(vocab.numel())
        self.index = index  # full id -> position in vocab (vocab.numel(): the lump)
        self.lump = math.log(vocab_size - vocab.numel())

    def logits(self, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """h [..., D] -> [..., len(vocab) + 1]: the vocabulary's logits, then the lump's (the
        log of the unseen tokens' summed exp(0)). A softmax over it is the full-vocabulary
        softmax with the unseen tokens merged into the last entry."""
        out = F.linear(h, head[self.vocab])
        return torch.cat([out, out.new_full((*out.shape[:-1], 1), self.lump)], -1)

    def nll(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token negative log-likelihood over the full vocabulary (an unseen label gets the
        lump's log-probability less the log of the unseen count)."""
        idx = self.index[labels]
        out = F.cross_entropy(logits.flatten(0, -2), idx.flatten(), reduction="none")
        return (out + (idx == self.vocab.numel()).flatten() * self.lump).view(labels.shape)


def train(
    model,
    corpus,
    support: Support,
    *,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    seed: int,
    deadline: float,
    log_every: int = 10,
) -> dict:
    """AdamW, linear warm-up then cosine decay to lr/10, gradient clipping at 1."""
    from tiny_training.corpus import windows

    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, steps // 20)
    head = model.lm_head.weight
    model.train()
    t0, losses, done = time.monotonic(), [], 0
    for step in range(steps):
        if time.monotonic() > deadline:
            print(f"target: time limit hit after {step} of {steps} steps", flush=True)
            break
        frac = step / warm if step < warm else (step - warm) / max(1, steps - warm)
        scale = frac if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        x = windows(corpus.train, seq_len + 1, batch, gen)
        h = model.model(input_ids=x[:, :-1]).last_hidden_state
        loss = support.nll(support.logits(h, head), x[:, 1:]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        done = step + 1
        if done % log_every == 0 or done == steps:
            el = time.monotonic() - t0
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(
                f"target step {done}/{steps} loss {recent:.3f} lr {lr * scale:.2e} "
                f"{done * batch * seq_len / el:.0f} tok/s, {el:.0f}s elapsed, "
                f"~{el / done * (steps - done):.0f}s left",
                flush=True,
            )
    model.eval()
    return {"steps": done, "seconds": time.monotonic() - t0, "losses": losses}


def round_to_shipped(model) -> None:
    """Round every trained tensor to what the shipped file stores (bf16, fp32-kept ones
    unchanged), so that what is evaluated and what the drafter learns from is what ships."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and p.is_floating_point() and not keep_fp32(name):
                p.copy_(p.bfloat16().float())


def taps_and_hidden(model, ids: torch.Tensor, layers: tuple[int, ...]):
    """One no-grad forward: the taps [B, S, len(layers), D] (each layer's output streams,
    averaged) and the final hidden state [B, S, D] (what the LM head reads)."""
    got: dict[int, torch.Tensor] = {}
    hooks = [
        model.model.layers[i].register_forward_hook(
            lambda _m, _a, out, i=i: got.__setitem__(i, out.mean(2))
        )
        for i in layers
    ]
    try:
        with torch.no_grad():
            h = model.model(input_ids=ids).last_hidden_state
    finally:
        for hk in hooks:
            hk.remove()
    return torch.stack([got[i] for i in layers], 2), h


def generate_greedy(model, prompts: torch.Tensor, new: int, chunk: int = 32) -> torch.Tensor:
    """[N, P + new]: each prompt [N, P] (same length, so no padding) and its greedy
    continuation, through transformers' cached generation, `chunk` prompts at a time."""
    outs = []
    for i in range(0, prompts.shape[0], chunk):
        x = prompts[i : i + chunk]
        ones = torch.ones_like(x)
        with torch.no_grad():
            y = model.generate(
                x, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0,
                attention_mask=ones,
            )  # fmt: skip
        outs.append(y)
    return torch.cat(outs)
