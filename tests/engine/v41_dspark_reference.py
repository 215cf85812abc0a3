"""An independent reference of V4.1's DSpark drafter, from deepinfer-notes.md §1.9 and the order
of operations in DeepInfer 0.1.0's `models/mtp/dflash.py` and `models/decoder_layer.py`; it
shares no code with the engine (it builds on v41_reference's fp64 pieces: the hyper-connection
mixes, the experts, RoPE, RMSNorm).

One block at a time over the whole sequence, no cache: the target's forward (ReferenceV41)
gives the taps at every position; the block reads the window of them before its anchor. Where
DeepInfer's own torch references decide a value they are used, not rewritten: the taps' mean
over the streams (`dflash_input_store_ref`), the block's positions and the window of main keys
it attends to (`get_fused_dflash_get_input_ref`), and the confidence
(`confidence_head_fused_ref`).
"""

from __future__ import annotations

import math

import torch
from v41_reference import ReferenceV41, _rms, _rope

LINEAR_RING = 1 << 20  # a "ring" longer than any test sequence: its slots are the positions


class ReferenceDrafter:
    def __init__(self, ref: ReferenceV41, oracle) -> None:
        self.ref, self.oracle = ref, oracle
        t = ref.t
        self.targets = tuple(t["dspark_target_layer_ids"])
        self.g = t["dspark_block_size"]
        self.stages = sum(
            1 for k in ref.w if k.startswith("mtp.") and k.endswith(".attn_norm.weight")
        )
        ref.tap_layers = self.targets

        def mean(R: torch.Tensor) -> torch.Tensor:
            out = torch.empty(R.shape[0], R.shape[2], dtype=torch.float32)
            oracle.dflash_input_store_ref(R, out)
            return out.double()

        ref.tap_mean = mean

    def window(self, anchor_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the block's positions [g], the main-key positions it reads), from DeepInfer's draft
        input builder for one request whose last accepted position is anchor_pos - 1."""
        last = torch.tensor([anchor_pos - 1], dtype=torch.int32)
        out = self.oracle.fused_dflash_get_input_ref(
            last, last, torch.tensor([0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
            LINEAR_RING, self.g, self.ref.t["sliding_window"],
        )  # fmt: skip
        positions, kv_index = out[1].long(), out[5][0].long()
        keys = kv_index[kv_index >= 0]
        main = keys[keys < anchor_pos]  # the rest are the block's own rows
        if not torch.equal(keys[keys >= anchor_pos], positions):
            raise AssertionError("a block reads its own rows after the main keys")
        return positions, main

    def draft(self, tokens: list[int], decoder_floor: int = 0):
        """The greedy drafts after `tokens` (its last token is the anchor, not yet through the
        target) and their acceptance probabilities (temperature 1): two lists of g."""
        ref, t, w = self.ref, self.ref.t, self.ref.w
        anchor_pos = len(tokens) - 1
        ref.logits(tokens[:-1], decoder_floor)
        taps = torch.stack([ref.tapped[i] for i in self.targets], 1)  # [T, n, D]
        pos, ctx = self.window(anchor_pos)
        eps, hc, last = ref.eps, t["hc_mult"], f"mtp.{self.stages - 1}"
        main_x = _rms(taps[ctx].flatten(1) @ w["mtp.0.main_proj.weight"].T,
                      w["mtp.0.main_norm.weight"], eps)  # fmt: skip
        ids = [tokens[-1]] + [t["dspark_noise_token_id"]] * (self.g - 1)
        R = w["embed.weight"][ids][:, None].repeat(1, hc, 1)
        pre = torch.zeros(self.g, hc, dtype=torch.float64)
        pre[:, 0] = 1
        for s in range(self.stages):
            p = f"mtp.{s}"
            for part in ("attn", "ffn"):
                nxt, post, comb = ref._mixes(f"{p}.hc_{part}", R)
                xin = _rms((pre[..., None] * R).sum(1), w[f"{p}.{part}_norm.weight"], eps)
                if part == "attn":
                    f = self._attention(p, xin, pos, main_x, ctx)
                else:
                    f = ref._moe(f"{p}.ffn", xin, t["dspark_num_experts_per_tok"], [False] * self.g)
                R = post[..., None] * f[:, None] + torch.einsum("tmn,tmd->tnd", comb, R)
                pre = nxt
        y = (pre[..., None] * R).sum(1)  # the confidence head's input (before the norm)
        logits = _rms(y, w[f"{last}.norm.weight"], eps) @ w["head.weight"].T
        w1, w2 = w[f"{last}.markov_head.embed.weight"], w[f"{last}.markov_head.head.weight"]
        conf_w = w[f"{last}.confidence_head.proj.weight"].T.float().contiguous()
        prev, drafts, conf = tokens[-1], [], []
        for k in range(self.g):
            c = self.oracle.confidence_head_fused_ref(
                y[k : k + 1].float().contiguous(), conf_w, 1.0, w1[prev][None].float()
            )
            conf.append(float(c[0]))
            prev = int((logits[k] + w2 @ w1[prev]).argmax())
            drafts.append(prev)
        return drafts, conf

    def _attention(self, p, x, pos, main_x, ctx) -> torch.Tensor:
        """A stage's attention: the block's rows over the main keys of `ctx` and all its own
        rows (bidirectional), with the sinks; K = V."""
        ref, t, w = self.ref, self.ref.t, self.ref.w
        H, hd, eps, inv = t["num_attention_heads"], t["head_dim"], ref.eps, ref.inv_main
        a = f"{p}.attn"
        qlora = _rms(x @ w[f"{a}.wq_a.weight"].T, w[f"{a}.q_norm.weight"], eps)
        q = _rope((qlora @ w[f"{a}.wq_b.weight"].T).view(len(pos), H, hd), pos, inv)

        def keys(src: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            return _rope(_rms(src @ w[f"{a}.wkv.weight"].T, w[f"{a}.kv_norm.weight"], eps), at, inv)

        K = torch.cat([keys(main_x, ctx), keys(x, pos)])
        logit = torch.einsum("thd,sd->ths", q, K) / math.sqrt(hd)
        sink = w[f"{a}.attn_sink"].view(1, H, 1).expand(len(pos), H, 1)
        prob = torch.softmax(torch.cat([logit, sink], -1), -1)[..., :-1]
        out = _rope(torch.einsum("ths,sd->thd", prob, K), pos, inv, inverse=True)
        G = t["o_groups"]
        wa = w[f"{a}.wo_a.weight"].view(G, t["o_lora_rank"], -1)
        mixed = torch.einsum("tgi,goi->tgo", out.reshape(len(pos), G, -1), wa)
        return mixed.reshape(len(pos), -1) @ w[f"{a}.wo_b.weight"].T
