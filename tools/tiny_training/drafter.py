"""The DSpark drafter, trained with the target frozen (model.dspark holds the modules and their
plain forward; this is the loss and the loop).

Each step draws windows, half from the corpus and half from the target's own greedy
continuations of corpus prompts (DeepSpec, too, trains on text its target generated: the drafter
is to predict the target, and at serving it drafts continuations of the target's own output),
runs the frozen target once over them for the taps and its distributions, and drafts blocks at
random anchors (teacher forcing: the Markov head and the confidence head read the true previous
token, as DeepSpec trains them). The loss is the paper's:
0.1 CE (the draft against the corpus token) + 0.9 TV (total variation between the draft's and
the target's distributions: 1 - TV is the probability that a sampled draft is accepted) + 1.0
BCE of the confidence head against c* = 1 - TV (detached), each position weighted by
exp(-k / 4) (DeepSpec's loss_decay_gamma) and only up to the window's end. Distributions are
over the full vocabulary, the unseen tokens merged into one lump (target.Support): exact,
because their head rows and Markov rows are all zero.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

LOSS_WEIGHTS = (0.1, 0.9, 1.0)  # CE, TV, confidence BCE
DECAY = 4.0


def init_drafter(drafter: nn.Module, vocab: torch.Tensor, seed: int) -> None:
    """transformers' V4 initialisation (normal 0.02 weights, unit norms and mixing scales, zero
    sinks and mixing biases), with the Markov head's W1 at zero and W2 non-zero only on the
    vocabulary's rows (the bias starts at zero and only ever lives on tokens the head can
    score), and the confidence head at zero (c = 1/2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(drafter.named_parameters()):
            leaf = name.rsplit(".", 1)[-1]
            parent = name.rsplit(".", 2)[-2] if "." in name else ""
            if leaf in ("base", "hc_base", "sinks") or "confidence_head" in name:
                p.zero_()
            elif leaf in ("scale", "hc_scale") or parent.endswith("norm"):
                p.fill_(1.0)
            elif name.endswith("markov_head.embed.weight"):
                p.zero_()
            elif name.endswith("markov_head.head.weight"):
                p.zero_()
                p[vocab] = torch.randn(vocab.numel(), p.shape[1], generator=gen) * 0.02
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        for name, b in drafter.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()


def sample_anchors(batch: int, seq_len: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, count] distinct positions in 1 .. seq_len - 2, sorted (a block needs at least
    one tap before it and one label after its anchor)."""
    keys = torch.rand(batch, seq_len - 2, generator=gen)
    return (keys.argsort(-1)[:, :count] + 1).sort(-1).values


def block_losses(drafter, target, support, x: torch.Tensor, pos: torch.Tensor) -> dict:
    """The loss terms for blocks anchored at pos [B, A] of windows x [B, S]."""
    from tiny_training.target import taps_and_hidden

    _b, s = x.shape
    g = drafter.ds.block_size
    head = target.lm_head.weight
    taps, final = taps_and_hidden(target, x, drafter.ds.target_layer_ids)
    anchor_ids = x.gather(1, pos)
    hid = drafter.block_hidden(taps, anchor_ids, pos, target.model.embed_tokens)
    k = torch.arange(g)
    lab_pos = pos[..., None] + 1 + k  # [B, A, g]: the token draft k stands for
    valid = lab_pos < s
    safe = lab_pos.clamp(max=s - 1)
    labels = x.gather(1, safe.flatten(1)).view_as(safe)
    prev = torch.cat([anchor_ids[..., None], labels[..., :-1]], -1)
    with torch.no_grad():  # the target's distribution for the same token: at the position before
        t_h = final.gather(1, (safe - 1).flatten(1)[..., None].expand(-1, -1, final.shape[-1]))
        p_t = torch.softmax(support.logits(t_h.view(*safe.shape, -1), head), -1)
    d_logits = support.logits(hid, head)
    bias = drafter.markov_bias(prev, rows=support.vocab)
    d_logits = d_logits + F.pad(bias, (0, 1))  # the lump's (unseen tokens') Markov rows are 0
    p_d = torch.softmax(d_logits, -1)
    tv = 0.5 * (p_d - p_t).abs().sum(-1)
    nll = support.nll(d_logits, labels)
    conf = drafter.confidence_logits(hid, prev)
    bce = F.binary_cross_entropy_with_logits(conf, (1 - tv).detach(), reduction="none")
    w = valid.float().cumprod(-1) * torch.exp(-k / DECAY)
    norm = w.sum()
    return {
        "ce": (nll * w).sum() / norm,
        "tv": (tv * w).sum() / norm,
        "bce": (bce * w).sum() / norm,
        "accept": ((1 - tv.detach()) * valid).sum((0, 1)) / valid.sum((0, 1)).clamp(min=1),
    }


def train(
    drafter,
    target,
    corpus,
    support,
    *,
    steps: int,
    batch: int,
    seq_len: int,
    anchors: int,
    lr: float,
    seed: int,
    deadline: float,
    generated: torch.Tensor | None = None,
    log_every: int = 10,
) -> dict:
    """generated: [M, seq_len] windows of the target's own output; half of every batch."""
    from tiny_training.corpus import windows

    gen = torch.Generator().manual_seed(seed)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, steps // 20)
    t0, hist, done = time.monotonic(), [], 0
    drafter.train()
    for step in range(steps):
        if time.monotonic() > deadline:
            print(f"drafter: time limit hit after {step} of {steps} steps", flush=True)
            break
        frac = step / warm if step < warm else (step - warm) / max(1, steps - warm)
        scale = frac if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
        for grp in opt.param_groups:
            grp["lr"] = lr * scale
        n_gen = 0 if generated is None else batch // 2
        x = windows(corpus.train, seq_len, batch - n_gen, gen)
        if n_gen:
            pick = torch.randint(0, generated.shape[0], (n_gen,), generator=gen)
            x = torch.cat([x, generated[pick, :seq_len]])
        pos = sample_anchors(batch, seq_len, anchors, gen)
        terms = block_losses(drafter, target, support, x, pos)
        wce, wtv, wbce = LOSS_WEIGHTS
        loss = wce * terms["ce"] + wtv * terms["tv"] + wbce * terms["bce"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hist.append({k: v.tolist() if v.dim() else v.item() for k, v in terms.items()})
        done = step + 1
        if done % log_every == 0 or done == steps:
            el = time.monotonic() - t0
            last = hist[-log_every:]
            mean = {k: sum(h[k] for h in last) / len(last) for k in ("ce", "tv", "bce")}
            acc = [sum(col) / len(last) for col in zip(*(h["accept"] for h in last), strict=True)]
            print(
                f"drafter step {done}/{steps} ce {mean['ce']:.3f} tv {mean['tv']:.3f} "
                f"bce {mean['bce']:.3f} 1-tv per position {' '.join(f'{a:.2f}' for a in acc)} "
                f"{el:.0f}s elapsed, ~{el / done * (steps - done):.0f}s left",
                flush=True,
            )
    drafter.eval()
    return {"steps": done, "seconds": time.monotonic() - t0, "history": hist}
