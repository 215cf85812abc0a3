"""An independent reference of the DeepSeek V4.1 forward, written from the equations of the
V4.1 report and DeepInfer 0.1.0 as summarised in ../shared/reference (deepinfer-notes.md §1,
deepseek-v4-architecture.md §1.3-1.4); it shares no code with the engine.

It runs one whole sequence at once, with no cache: every compressed entry is pooled from the
layer input of its tokens, every query scans the whole sequence under the visibility rules, and
the logits of every position come out. Slow and plain on purpose: loops where the equations
are per token.

DeepInfer's model forward cannot run on CPU (see v41_oracle.py); its pieces that can run are
used here instead of our own where they decide an exact value: the Engram table sizes and hash
multipliers come from DeepInfer's `NgramHashMapping` when the oracle is given.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w.double() if w is not None else y


def _inv_freq(dim: int, theta: float, yarn: dict | None) -> torch.Tensor:
    base = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if not yarn:
        return base

    def corr(rot: float) -> float:
        orig = yarn["original_max_position_embeddings"]
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(corr(yarn["beta_fast"])), 0)
    hi = min(math.ceil(corr(yarn["beta_slow"])), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency (high frequencies), 0: interpolated
    return base / yarn["factor"] * (1 - keep) + base * keep


def _rope(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, inverse: bool = False):
    """Rotate interleaved pairs of the trailing 2 * len(inv) channels; x [T, ..., D]."""
    r = 2 * inv.shape[0]
    ang = pos.double()[:, None] * inv[None]  # [T, r/2]
    if inverse:
        ang = -ang
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (r // 2,)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    out = x.clone()
    a, b = x[..., -r::2], x[..., -r + 1 :: 2]
    out[..., -r::2] = a * cos - b * sin
    out[..., -r + 1 :: 2] = a * sin + b * cos
    return out


class ReferenceV41:
    """cfg: the config.json dict; weights: name -> tensor (the official naming)."""

    def __init__(
        self, cfg: dict, weights: dict[str, torch.Tensor], engram_tables=None, engram_lookup=None
    ):
        """engram_tables: {layer: (primes [orders][heads], multipliers)}; engram_lookup: token
        id -> compressed id when the config compresses Engram's vocabulary."""
        self.top, self.t = cfg, cfg["text_config"]
        self.w = {k: v.detach().double() for k, v in weights.items()}
        t = self.t
        self.L = t["num_hidden_layers"]
        self.ratios = t["compress_ratios"][: self.L]
        self.boundary = next((i for i, r in enumerate(self.ratios) if r == 1), self.L)
        self.eps = t["rms_norm_eps"]
        rd = t["qk_rope_head_dim"]
        self.inv_main = _inv_freq(rd, t["rope_theta"], None)
        self.inv_comp = _inv_freq(rd, t["compress_rope_theta"], t.get("rope_scaling"))
        self.engram_tables = engram_tables or {}
        self.engram_lookup = engram_lookup
        # DSpark taps (v41_dspark_reference): layers whose attention-input streams `logits`
        # keeps, reduced by `tap_mean` ([T, hc, D] -> [T, D]), in `tapped`.
        self.tap_layers: tuple[int, ...] = ()
        self.tap_mean = lambda R: R.mean(1)
        self.tapped: dict[int, torch.Tensor] = {}

    # ---- sharing maps (the nearest source at or before a layer) ------------------------------

    def _src(self, key: str, layer: int) -> int:
        ids = self.t.get(key) or self.t["kv_source_layer_ids"]
        return max(i for i in ids if i <= layer)

    # ---- pieces ------------------------------------------------------------------------------

    def _mixes(self, prefix: str, R: torch.Tensor):
        hc = self.t["hc_mult"]
        fn, base, scale = (self.w[f"{prefix}_{k}"] for k in ("fn", "base", "scale"))
        flat = R.reshape(R.shape[0], -1)
        z = (flat @ fn.T) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps)
        z = z * torch.cat([scale[:1].repeat(hc), scale[1:2].repeat(hc), scale[2:].repeat(hc * hc)])
        z = z + base
        pre = torch.sigmoid(z[:, :hc]) + self.t["hc_eps"]
        post = 2 * torch.sigmoid(z[:, hc : 2 * hc])
        eps = self.t["hc_eps"]
        comb = torch.softmax(z[:, 2 * hc :].view(-1, hc, hc), -1) + eps
        comb = comb / (comb.sum(1, keepdim=True) + eps)  # columns first
        for _ in range(self.t["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(2, keepdim=True) + eps)
            comb = comb / (comb.sum(1, keepdim=True) + eps)
        return pre, post, comb  # new stream n = post_n * out + sum_m comb[m, n] * R_m

    def _expert(self, p: str, x: torch.Tensor) -> torch.Tensor:
        lim = self.t["swiglu_limit"]
        g = x @ self.w[f"{p}.w1.weight"].T
        u = x @ self.w[f"{p}.w3.weight"].T
        return (F.silu(g.clamp(max=lim)) * u.clamp(-lim, lim)) @ self.w[f"{p}.w2.weight"].T

    def _moe(self, p: str, x: torch.Tensor, top_k: int, image: list[bool]) -> torch.Tensor:
        scores = torch.sqrt(F.softplus(x @ self.w[f"{p}.gate.weight"].T))
        out = self._expert(f"{p}.shared_experts", x)
        for t in range(x.shape[0]):
            # Image tokens are routed with their own bias (the V4.1 report's modality-specific
            # load balancing; DeepInfer's gate takes bias_vl for them).
            bias = self.w[f"{p}.gate.bias_vl" if image[t] else f"{p}.gate.bias"]
            chosen = (scores[t] + bias).topk(top_k).indices
            wts = scores[t, chosen] / scores[t, chosen].sum() * self.t["routed_scaling_factor"]
            for e, wt in zip(chosen.tolist(), wts, strict=True):
                out[t] = out[t] + wt * self._expert(f"{p}.experts.{e}", x[t : t + 1])[0]
        return out

    def _engram(self, layer: int, R: torch.Tensor, tokens: list[int], image: list[bool]):
        t = self.t
        primes, mults = self.engram_tables[layer]  # [orders][heads], [max_ngram]
        pad = t["engram_pad_token_id"]
        lookup = self.engram_lookup or None
        offsets, acc = [], 0
        for per in primes:
            row = []
            for p in per:
                row.append(acc)
                acc += p
            offsets.append(row)
        table = self.w[f"layers.{layer}.engram.embed.weight"]
        embs = []
        for i in range(len(tokens)):
            parts = []
            for o, per in enumerate(primes):
                n = o + 2
                h, seen = 0, False
                for j in range(n):
                    tok = tokens[i - j] if i - j >= 0 else pad
                    # An image token ends the n-gram: it and all before it read as the pad
                    # (DeepInfer's gather_engram_tokens reference: the image sentinel).
                    seen = seen or (i - j >= 0 and image[i - j])
                    if seen:
                        tok = pad
                    if lookup is not None:
                        tok = lookup[tok]
                    h ^= tok * int(mults[j])
                for k, p in enumerate(per):
                    parts.append(table[h % p + offsets[o][k]])
            embs.append(torch.cat(parts))
        kv = torch.stack(embs) @ self.w[f"layers.{layer}.engram.wkv.weight"].T
        hc, d = t["hc_mult"], t["hidden_size"]
        keys, value = kv[:, : hc * d].view(-1, hc, d), kv[:, hc * d :]
        qn = _rms(R, None, self.eps) * self.w[f"layers.{layer}.engram.q_weight"]
        kn = _rms(keys, None, self.eps) * self.w[f"layers.{layer}.engram.k_weight"]
        dot = (qn * kn).sum(-1) / math.sqrt(d)
        gate = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp(min=1e-6)))
        gate = gate * torch.tensor([0.0 if im else 1.0 for im in image], dtype=gate.dtype)[:, None]
        return R + gate[..., None] * value[:, None]

    # ---- attention ---------------------------------------------------------------------------

    def _attention(self, layer: int, x: torch.Tensor, st: dict) -> torch.Tensor:
        t, w, p = self.t, self.w, f"layers.{layer}.attn"
        T = x.shape[0]
        pos = torch.arange(T)
        r = self.ratios[layer]
        H, hd, W = t["num_attention_heads"], t["head_dim"], t["sliding_window"]
        inv = self.inv_main if r == 0 else self.inv_comp
        qlora = _rms(x @ w[f"{p}.wq_a.weight"].T, w[f"{p}.q_norm.weight"], self.eps)
        q = _rope((qlora @ w[f"{p}.wq_b.weight"].T).view(T, H, hd), pos, inv)
        kv = _rope(_rms(x @ w[f"{p}.wkv.weight"].T, w[f"{p}.kv_norm.weight"], self.eps), pos, inv)
        if layer == self.boundary:
            st["shared"] = x
        selected = [[] for _ in range(T)]
        if r:
            kv_src = self._src("kv_source_layer_ids", layer)
            if kv_src == layer:  # Full: pool this layer's (encoder) or the shared (decoder) input
                src = x if layer < self.boundary else st["shared"]
                lat = src @ w[f"{p}.compressor.wkv.weight"].T
                sc = src @ w[f"{p}.compressor.wgate.weight"].T if r > 1 else None
                mains, keys = [], []
                for e in range(T // r):
                    if r == 1:
                        pooled = lat[e]
                    else:
                        win = slice(e * r, e * r + r)
                        pooled = (torch.softmax(sc[win], 0) * lat[win]).sum(0)
                    c = _rms(pooled, w[f"{p}.compressor.norm.weight"], self.eps)
                    ep = torch.tensor([e * r])
                    mains.append(_rope(c[None], ep, self.inv_comp)[0])
                    k = _rms(c @ w[f"{p}.indexer.wk.weight"].T, w[f"{p}.indexer.k_norm.weight"],
                             self.eps)  # fmt: skip
                    keys.append(_rope(k[None], ep, self.inv_comp)[0])
                cached = self.replay_cached
                if cached is not None:  # entries before the hit come from the cached blocks
                    for e in range(min(len(mains), cached[0] // r)):
                        mains[e], keys[e] = cached[1]["main", layer][e], cached[1]["keys", layer][e]
                empty = torch.zeros(0, hd, dtype=torch.float64)
                st["main", layer] = torch.stack(mains) if mains else empty
                st["keys", layer] = torch.stack(keys) if keys else empty[:, : t["index_head_dim"]]
            main = st["main", kv_src]
            keys = st["keys", self._src("index_k_source_layer_ids", layer)]
            ix_src = self._src("index_source_layer_ids", layer)
            if ix_src == layer:
                selected = self._indexer(layer, x, qlora, keys, st)
                st["topk", layer] = selected
            else:
                selected = st["topk", ix_src]
        out = torch.zeros(T, H, hd, dtype=torch.float64)
        sink = w[f"{p}.attn_sink"]
        floor = self.decoder_floor if layer >= self.boundary else 0
        floor = max(floor, self.replay_floor)
        for i in range(T):
            lo = max(0, i - W + 1, floor if i >= floor else 0)
            ks = [kv[j] for j in range(lo, i + 1)]
            ks += [main[e] for e in sorted(selected[i])]
            K = torch.stack(ks)  # K = V
            logit = (q[i] @ K.T) / math.sqrt(hd)  # [H, m]
            full = torch.cat([logit, sink[:, None]], 1)
            prob = torch.softmax(full, 1)[:, :-1]
            out[i] = prob @ K
        out = _rope(out, pos, inv, inverse=True)
        G = t["o_groups"]
        wa = w[f"{p}.wo_a.weight"].view(G, t["o_lora_rank"], -1)
        mixed = torch.einsum("tgi,goi->tgo", out.reshape(T, G, -1), wa)
        return mixed.reshape(T, -1) @ w[f"{p}.wo_b.weight"].T

    def _indexer(self, layer, x, qlora, keys, st) -> list[set[int]]:
        t, w, p = self.t, self.w, f"layers.{layer}.attn.indexer"
        T, r = x.shape[0], self.ratios[layer]
        Hi, di = t["index_n_heads"], t["index_head_dim"]
        iq = _rope(
            (qlora @ w[f"{p}.wq_b.weight"].T).view(T, Hi, di), torch.arange(T), self.inv_comp
        )
        hw = x @ w[f"{p}.weights_proj.weight"].T
        cand_src = t.get("candidate_source_layer_id")
        out = []
        if layer == cand_src:
            st["cand"] = []
        for i in range(T):
            nvis = (i + 1) // r
            score = {e: float((hw[i] * torch.relu(iq[i] @ keys[e])).sum()) for e in range(nvis)}
            if layer == cand_src:
                bs, keep = t["candidate_block_size"], t["candidate_topk_blocks"]
                nb = -(-nvis // bs)
                bscore = [max(score[e] for e in range(b * bs, min(nvis, b * bs + bs)))
                          for b in range(nb)]  # fmt: skip
                if nb:
                    bscore[nb - 1] = math.inf  # the newest block is always a candidate
                blocks = sorted(range(nb), key=lambda b: -bscore[b])[:keep]
                st["cand"].append(
                    {e for b in blocks for e in range(b * bs, min(nvis, b * bs + bs))}
                )
            if cand_src is not None and layer > cand_src:
                score = {e: s for e, s in score.items() if e in st["cand"][i]}
            best = sorted(score, key=lambda e: -score[e])[: t["index_topk"]]
            out.append(set(best))
        return out

    # ---- the model -------------------------------------------------------------------------

    def logits(
        self, tokens: list[int], decoder_floor: int = 0, replay: tuple[int, int] | None = None,
        embeds: dict[int, torch.Tensor] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """[len(tokens), vocab] fp64 logits of every position. decoder_floor: the decoder's
        bounded replay (DeepInfer's `mask` mode): a decoder query at or after it sees window
        keys at or after it only (rows before it are computed but meaningless).

        replay = (floor, hit): SWA bounded replay after a prefix hit without a ring (V4.1
        report §3.2): the global KV of the first `hit` tokens is the cached one (computed by a
        full run), every layer's window restarts at `floor` (queries at or after it see keys
        at or after it), the replayed tokens regenerate only the windows.

        embeds: position -> input embedding of each image token (ids >= the vocabulary); those
        tokens take no Engram memory and route with the image bias."""
        self.decoder_floor, self.replay_floor, self.replay_cached = decoder_floor, 0, None
        if replay is not None:
            self.logits(tokens, decoder_floor, embeds=embeds)
            self.replay_floor, self.replay_cached = replay[0], (replay[1], self._st)
        t, w = self.t, self.w
        hc = t["hc_mult"]
        vocab = w["embed.weight"].shape[0]
        image = [tok >= vocab for tok in tokens]
        if sorted((embeds or {}).keys()) != [i for i, im in enumerate(image) if im]:
            raise ValueError("embeds must give exactly the image tokens' embeddings")
        x = torch.stack([
            embeds[i].to(torch.float64) if im else w["embed.weight"][tok]
            for i, (tok, im) in enumerate(zip(tokens, image, strict=True))
        ])  # fmt: skip
        R = x[:, None].repeat(1, hc, 1)
        pre = torch.zeros(len(tokens), hc, dtype=torch.float64)
        pre[:, 0] = 1  # the first sublayer reads stream 0
        st: dict = {}
        self._st = st
        engram_layers = t.get("engram_layer_ids") or []
        for layer in range(self.L):
            lp = f"layers.{layer}"
            if layer in engram_layers:
                R = self._engram(layer, R, tokens, image)
            if layer in self.tap_layers:
                self.tapped[layer] = self.tap_mean(R)
            for part in ("attn", "ffn"):
                nxt, post, comb = self._mixes(f"{lp}.hc_{part}", R)
                xin = _rms((pre[..., None] * R).sum(1), w[f"{lp}.{part}_norm.weight"], self.eps)
                if part == "attn":
                    f = self._attention(layer, xin, st)
                else:
                    f = self._moe(f"{lp}.ffn", xin, t["num_experts_per_tok"], image)
                R = post[..., None] * f[:, None] + torch.einsum("tmn,tmd->tnd", comb, R)
                pre = nxt  # shifted: this sublayer's pre mix feeds the next one
        y = _rms((pre[..., None] * R).sum(1), w["norm.weight"], self.eps)
        return y @ w["head.weight"].T


def engram_tables_from_deepinfer(oracle, text_cfg: dict, vocab_size: int, tokenizer=None) -> dict:
    """{layer: (primes [orders][heads], multipliers)} from DeepInfer's NgramHashMapping
    (tokenizer: the tokenizer.json its compressed vocabulary is built from, if compressing)."""
    n_tables = text_cfg["engram_max_ngram_size"] - 1
    cfg = oracle.AttrDict(
        vocab_size=[text_cfg["engram_vocab_size"]] * n_tables,
        n_head_per_ngram=[text_cfg["engram_n_heads"]] * n_tables,
        n_embed_per_ngram=[text_cfg["engram_head_dim"] * text_cfg["engram_n_heads"]] * n_tables,
        engram_max_ngram_size=text_cfg["engram_max_ngram_size"],
        engram_layer_ids=list(text_cfg["engram_layer_ids"]),
        enable_tokenizer_compression=tokenizer is not None,
        tokenizer_name_or_path=str(tokenizer),
        tokenizer_vocab_size=vocab_size,
    )
    mapping = oracle.NgramHashMapping(cfg, device="cpu")
    layout = oracle.EngramLayout.from_cfg(cfg)
    return {
        layer: (layout.layer_vocab_sizes[layer], mapping.ngram_multipliers[i].tolist())
        for i, layer in enumerate(mapping.layer_ids)
    }
