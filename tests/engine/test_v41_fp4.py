"""FP4 main KV and indexer keys (DEEPRING_V41_KV_CACHE=fp4): the quantiser against an
independent reference quantiser, the bytes per token, and the model's logits with FP4 pages
against plain ones."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from deepring.cache.pool import KVCachePool
from deepring.model.config import ModelConfig
from deepring.model.presets import V41_FLASH
from deepring.model.v41.kvquant import dequantize_fp4, quantize_fp4
from v41_helpers import make_pool, new_seqs, step, tiny_model

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _ref_code(v: float) -> int:
    """Nearest E2M1 magnitude (saturating at 6), ties to the even code; sign in bit 3."""
    m = min(abs(v), 6.0)
    best = min(range(8), key=lambda k: (abs(GRID[k] - m), k % 2))
    return best | (8 if v < 0 else 0)


def _ref_quantize(x: torch.Tensor, group: int) -> bytes:
    """One entry, byte by byte: E2M1 pairs (low nibble first), then the scales: E4M3 of
    amax / 6 (floored at the smallest E4M3 subnormal x 6, as DeepInfer's reference cast does)
    for groups of 16; the biased exponent of 2^ceil(log2(amax / 6)) for groups of 32."""
    vals = x.tolist()
    codes, scales = [], []
    for g in range(0, len(vals), group):
        chunk = vals[g : g + group]
        amax = max(abs(v) for v in chunk)
        if group == 16:
            s = torch.tensor(max(amax, 2.0**-9 * 6) / 6).to(torch.float8_e4m3fn)
            scales.append(int(s.view(torch.uint8)))
            scale = float(s.float())
        else:
            # exponents from -126 (the smallest normal fp32 power: an all-zero group) to 127
            e = min(127, max(-126, math.ceil(math.log2(max(amax, 2.0**-126) / 6))))
            scales.append(e + 127)
            scale = 2.0**e
        codes += [_ref_code(v / scale) for v in chunk]
    packed = [codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2)]
    return bytes(packed + scales)


@pytest.mark.parametrize(("width", "group"), [(32, 16), (64, 16), (32, 32), (128, 32)])
def test_quantiser_matches_the_reference_bit_for_bit(width, group):
    g = torch.Generator().manual_seed(width + group)
    x = torch.randn(20, width, generator=g) * torch.logspace(-3, 2, 20)[:, None]
    x[0] = 0.0  # an all-zero group
    x[1, :4] = torch.tensor([0.25, 0.75, -2.5, 5.0])  # exact ties (scale 1 when amax = 6)
    x[1, 4] = 6.0
    got = quantize_fp4(x, group)
    for row in range(x.shape[0]):
        assert bytes(got[row].tolist()) == _ref_quantize(x[row], group), row
    back = dequantize_fp4(got, width, group)
    # Round trip: within half the largest E2M1 gap (6 - 4) times the group's scale, or the
    # saturation above 6 x scale when the E4M3 scale rounded down.
    sb = got[:, width // 2 :]
    scale = sb.contiguous().view(torch.float8_e4m3fn).float() if group == 16 else torch.exp2(
        sb.float() - 127)  # fmt: skip
    err = (back - x).abs().view(20, -1, group).amax(-1)
    amax = x.abs().view(20, -1, group).amax(-1)
    assert torch.all(err <= torch.maximum(scale, amax - 6 * scale) * (1 + 1e-6))


def test_flash_global_kv_is_890_bytes_per_token():
    cfg = ModelConfig.from_hf_dict(V41_FLASH)
    assert cfg.global_kv_bytes_per_token(fp4=True) == 890
    layout = cfg.cache_layout(torch.bfloat16, fp4=True)
    per_token = sum(
        (lay.page_width + lay.index_page_width) / lay.ratio for lay in layout.layers if lay.ratio
    )
    assert per_token == 890


def test_fp4_pages_are_bytes_and_logits_stay_close():
    """The same steps with FP4 pages and with bf16 pages (rings bf16 in both). FP4 keeps one
    bit of mantissa with a scale per 16 (8 here: head_dim 32): on this tiny random model the
    logits move by 8% of their mean magnitude on average (measured 0.08 against 0.79, at most
    ~1.1) and 7 of 8 argmaxes stay. Stated tolerance: mean |diff| < 15% of mean |logit|, max
    < 2, at least 3 of 4 argmaxes equal."""
    model = tiny_model()
    plain = make_pool(model)
    cache = plain.cache
    plain = KVCachePool(model.config.cache_layout(torch.bfloat16, fp4=False), cache)
    fp4 = KVCachePool(model.config.cache_layout(torch.bfloat16, fp4=True), cache)
    assert fp4.layers[2].comp.dtype == torch.uint8
    assert fp4.layers[2].comp.shape[-1] == 32 // 2 + 32 // 16  # head_dim 32
    assert fp4.layers[5].index.shape[-1] == 32 // 2 + 32 // 32  # index_head_dim 32
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(3, 512, (18,), generator=g).tolist()
    outs = []
    for pool in (plain, fp4):
        s = new_seqs(1)[0]
        rows = [step(model, pool, [s.chunk(prompt, logits="all")])]
        for tok in itertools.islice(prompt, 6):
            rows.append(step(model, pool, [s.chunk([tok])]))
        outs.append(torch.cat(rows))
    diff = (outs[0] - outs[1]).abs()
    assert 0 < diff.mean() < 0.15 * outs[0].abs().mean()
    assert diff.max() < 2
    assert (outs[0].argmax(-1) == outs[1].argmax(-1)).float().mean() >= 0.75


def test_the_bytes_line_said_at_start():
    from deepring.core.build import kv_bytes_line

    flash = ModelConfig.from_hf_dict(V41_FLASH)
    line = kv_bytes_line(flash.cache_layout(torch.bfloat16, fp4=True), 128)
    assert line.startswith("890 B/token of global KV (FP4 main KV + indexer keys)")
    plain = kv_bytes_line(flash.cache_layout(torch.bfloat16, fp4=False), 128)
    assert plain.startswith(f"{flash.global_kv_bytes_per_token(fp4=False):g} B/token")
