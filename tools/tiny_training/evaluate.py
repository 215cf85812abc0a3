"""Offline measurements: held-out perplexity, greedy draft-and-verify, confidence calibration.

The draft-and-verify loop is the simplest correct one, batched over prompts: each round the
drafter drafts a block from the anchor (the last committed token) and the taps of the committed
tokens before it; the target then runs once over committed tokens + drafts (a full recompute,
no cache: causal, so each position sees what it would see in a cached engine, and right-padding
never leaks backwards), its greedy token at each block position verifies the draft there; the
longest agreeing prefix is kept plus the target's own next token (the bonus), which becomes the
next anchor. Greedy speculative decoding is lossless: the output must equal plain greedy decoding
(checked, as far as floating point allows: a batch of other shapes can flip a near-tie).
"""

from __future__ import annotations

import torch

ECE_BINS = 10
TEMPERATURES = torch.exp(torch.linspace(-2.5, 2.5, 101)).tolist()  # ~0.08 .. 12


def heldout_nll(target, corpus, support, seq_len: int, max_tokens: int) -> dict:
    """Mean full-vocabulary NLL over held-out files, in windows of seq_len (as trained)."""
    total, count = 0.0, 0
    head = target.lm_head.weight
    for ids in corpus.held_out:
        for start in range(0, ids.numel() - 1, seq_len):
            if count >= max_tokens:
                break
            chunk = ids[start : start + seq_len + 1]
            if chunk.numel() < 17:
                continue
            with torch.no_grad():
                h = target.model(input_ids=chunk[None, :-1]).last_hidden_state
                nll = support.nll(support.logits(h, head), chunk[None, 1:])
            total += float(nll.sum())
            count += nll.numel()
    mean = total / count
    return {"nll": mean, "ppl": float(torch.exp(torch.tensor(mean))), "tokens": count}


def _forward(target, seqs: list[list[int]], layers):
    """Right-padded forward over sequences: taps [B, L, n, D], final hidden [B, L, D]."""
    from tiny_training.target import taps_and_hidden

    width = max(len(s) for s in seqs)
    x = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.tensor(s)
    return taps_and_hidden(target, x, layers)


def greedy(target, prompts: list[list[int]], n: int, layers) -> list[list[int]]:
    seqs = [list(p) for p in prompts]
    head = target.lm_head.weight
    for _ in range(n):
        _, h = _forward(target, seqs, layers)
        last = torch.stack([h[i, len(s) - 1] for i, s in enumerate(seqs)])
        for s, t in zip(seqs, (last @ head.T).argmax(-1).tolist(), strict=True):
            s.append(t)
    return [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)]


def speculate(target, drafter, prompts: list[list[int]], n: int) -> dict:
    """Greedy draft-and-verify of n tokens after each prompt. Returns the outputs, and per
    block the accepted draft count and the confidence logits."""
    layers = drafter.ds.target_layer_ids
    g = drafter.ds.block_size
    head, embed = target.lm_head.weight, target.model.embed_tokens
    seqs = [list(p) for p in prompts]
    taps, h = _forward(target, seqs, layers)
    first = torch.stack([h[i, len(s) - 1] for i, s in enumerate(seqs)]) @ head.T
    ctx = [taps[i, : len(s)] for i, s in enumerate(seqs)]  # taps of the committed tokens
    for s, t in zip(seqs, first.argmax(-1).tolist(), strict=True):
        s.append(t)  # the first anchor
    accepted, conf = [], []
    active = [i for i in range(len(seqs))]
    while active:
        width = max(ctx[i].shape[0] for i in active)
        t = torch.zeros(len(active), width, *ctx[active[0]].shape[1:])
        for j, i in enumerate(active):
            t[j, : ctx[i].shape[0]] = ctx[i]
        anchor = torch.tensor([seqs[i][-1] for i in active])
        pos = torch.tensor([len(seqs[i]) - 1 for i in active])
        with torch.no_grad():
            hid = drafter.block_hidden(t, anchor[:, None], pos[:, None], embed)[:, 0]
            drafts, _, z = drafter.draft_greedy(hid, anchor, head)
        cand = [seqs[i] + drafts[j].tolist() for j, i in enumerate(active)]
        taps, h = _forward(target, cand, layers)
        for j, i in enumerate(active):
            p = int(pos[j])
            preds = (h[j, p : p + g + 1] @ head.T).argmax(-1).tolist()
            d = drafts[j].tolist()
            a = 0
            while a < g and d[a] == preds[a]:
                a += 1
            seqs[i] += [*d[:a], preds[a]]
            ctx[i] = taps[j, : p + 1 + a]
            accepted.append(a)
            conf.append(z[j])
        active = [i for i in active if len(seqs[i]) - len(prompts[i]) < n]
    outs = [s[len(p) : len(p) + n] for s, p in zip(seqs, prompts, strict=True)]
    return {"outputs": outs, "accepted": torch.tensor(accepted), "conf": torch.stack(conf)}


def acceptance(accepted: torch.Tensor, g: int) -> dict:
    """Per draft position k, P(draft k accepted | drafts before it accepted); the mean accepted
    length tau = 1 + mean accepted drafts (the bonus token counts, as in the paper)."""
    per = []
    for k in range(g):
        reached = (accepted >= k).sum().item()
        per.append((accepted >= k + 1).sum().item() / reached if reached else float("nan"))
    tau = 1 + accepted.float().mean().item()
    return {"per_position": per, "tau": tau, "blocks": accepted.numel()}


def ece(pred: torch.Tensor, y: torch.Tensor, bins: int = ECE_BINS) -> float:
    idx = (pred * bins).long().clamp(0, bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum().item() * abs(pred[m].mean().item() - y[m].float().mean().item())
    return total / pred.numel()


def survival(z: torch.Tensor, temps: list[float]) -> torch.Tensor:
    return torch.sigmoid(z / torch.tensor(temps)).cumprod(-1)


def calibrate(z: torch.Tensor, accepted: torch.Tensor) -> dict:
    """Sequential temperature scaling: position by position, the temperature whose survival
    prod_{i<=k} sigmoid(z_i / T_i) has the least ECE against 'the first k drafts were all
    accepted', earlier positions' temperatures fixed. Fitted on every other block, the ECE
    reported on the rest (and on all)."""
    g = z.shape[1]
    y = accepted[:, None] >= torch.arange(1, g + 1)
    fit, test = slice(0, None, 2), slice(1, None, 2)
    temps = [1.0] * g
    for k in range(g):

        def err(t: float, k: int = k) -> float:
            return ece(survival(z[fit], [*temps[:k], t, *temps[k + 1 :]])[:, k], y[fit, k])

        temps[k] = min(TEMPERATURES, key=err)

    def report(part: slice, ts: list[float]) -> list[float]:
        s = survival(z[part], ts)
        return [ece(s[:, k], y[part, k]) for k in range(g)]

    before, after = report(test, [1.0] * g), report(test, temps)
    return {
        "temperatures": temps,
        "ece_before": before,
        "ece_after": after,
        "ece_before_mean": sum(before) / g,
        "ece_after_mean": sum(after) / g,
        "ece_all_before_mean": sum(report(slice(None), [1.0] * g)) / g,
        "ece_all_after_mean": sum(report(slice(None), temps)) / g,
    }
