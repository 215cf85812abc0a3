"""How V4.1's paged main KV and indexer keys are stored: as they are, or FP4.

FP4 (DEEPRING_V41_KV_CACHE=fp4; V4.1's checkpoints say `use_fp4_sparse_kv`): each entry is
E2M1 values, two per byte (element 2i in the low nibble), followed by one scale per group:
- main KV: groups of 16 channels, an E4M3 scale each, amax / 6 rounded to E4M3 (no global
  scale), quantised after RoPE: 512 channels -> 256 + 32 = 288 bytes;
- indexer keys: groups of 32, an E8M0 scale (a power of two, stored as its biased exponent),
  2^ceil(log2(amax / 6)): 128 channels -> 64 + 4 = 68 bytes.
Values are rounded to the nearest E2M1 number (0, 0.5, 1, 1.5, 2, 3, 4, 6; ties to the even
code) after division by the scale, and saturate at +-6 (an E4M3 scale rounded down can leave a
group's largest value just above 6). A uint8 page tensor selects this format: the pool's layout
decides, the codec follows it.
"""

from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MIN_POSITIVE = 2.0**-9  # the smallest E4M3 subnormal: the scale's floor
MAIN_GROUP, INDEX_GROUP = 16, 32

_MIDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def fp4_bytes(width: int, group: int) -> int:
    """Bytes of one FP4 entry of `width` channels with one scale byte per `group`."""
    return width // 2 + width // group


def _codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (sign << 3 | magnitude index) of v, rounded to nearest, ties to even."""
    mag = v.abs().clamp(max=E2M1_MAX)
    mids = _MIDS.to(v.device)
    idx = torch.bucketize(mag, mids)  # a value on a midpoint gets the lower code
    tie = (idx < len(mids)) & (mag == mids[idx.clamp(max=len(mids) - 1)]) & (idx % 2 == 1)
    idx = idx + tie.long()
    return idx | ((v < 0).long() << 3)


def _values(codes: torch.Tensor) -> torch.Tensor:
    mag = torch.tensor(E2M1_VALUES, device=codes.device)[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def quantize_fp4(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [N, width] -> [N, fp4_bytes(width, group)] uint8 (scales E4M3 for groups of 16, E8M0
    for groups of 32)."""
    n, width = x.shape
    if width % group or width % 2:
        raise ValueError(f"an FP4 entry of width {width} needs groups of {group} to divide it")
    g = x.float().view(n, width // group, group)
    amax = g.abs().amax(-1, keepdim=True)
    if group == MAIN_GROUP:
        sf = (amax.clamp(min=E4M3_MIN_POSITIVE * E2M1_MAX) / E2M1_MAX).clamp(max=E4M3_MAX)
        sf8 = sf.to(torch.float8_e4m3fn)
        scale, scale_bytes = sf8.float(), sf8.view(torch.uint8)
    else:
        # The exponent stays a normal fp32 power (>= -126): 2^-127 flushes to zero where
        # denormals are flushed, and an all-zero group would divide by it.
        exp = torch.ceil(torch.log2(amax.clamp(min=2.0**-126) / E2M1_MAX)).clamp(-126, 127)
        scale, scale_bytes = torch.exp2(exp), (exp + 127).to(torch.uint8)
    codes = _codes(g / scale).view(n, width)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return torch.cat([packed, scale_bytes.view(n, -1)], 1)


def dequantize_fp4(b: torch.Tensor, width: int, group: int) -> torch.Tensor:
    """The inverse of quantize_fp4 (up to rounding): [N, bytes] uint8 -> [N, width] fp32."""
    n = b.shape[0]
    packed, scale_bytes = b[:, : width // 2].long(), b[:, width // 2 :]
    codes = torch.stack([packed & 15, packed >> 4], -1).view(n, width)
    if group == MAIN_GROUP:
        scale = scale_bytes.contiguous().view(torch.float8_e4m3fn).float()
    else:
        scale = torch.exp2(scale_bytes.float() - 127)
    return (_values(codes).view(n, -1, group) * scale.unsqueeze(-1)).view(n, width)


class KVCodec:
    """Writes and reads the paged entries ([blocks, entries, width]): in the pages' own dtype,
    or FP4 when the pages are bytes."""

    def __init__(self, width: int, index_width: int) -> None:
        self.width, self.index_width = width, index_width

    @staticmethod
    def _store(pages: torch.Tensor, dest: torch.Tensor, rows: torch.Tensor, group: int) -> None:
        flat = pages.view(-1, pages.shape[-1])
        flat[dest] = (
            quantize_fp4(rows, group) if pages.dtype == torch.uint8 else rows.to(pages.dtype)
        )

    @staticmethod
    def _load(pages: torch.Tensor, flat: torch.Tensor, width: int, group: int) -> torch.Tensor:
        rows = pages.view(-1, pages.shape[-1])[flat]
        return dequantize_fp4(rows, width, group) if pages.dtype == torch.uint8 else rows

    def store_main(self, pages: torch.Tensor, dest: torch.Tensor, rows: torch.Tensor) -> None:
        self._store(pages, dest, rows, MAIN_GROUP)

    def load_main(self, pages: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        return self._load(pages, flat, self.width, MAIN_GROUP)

    def store_index(self, pages: torch.Tensor, dest: torch.Tensor, rows: torch.Tensor) -> None:
        self._store(pages, dest, rows, INDEX_GROUP)

    def load_index(self, pages: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        return self._load(pages, flat, self.index_width, INDEX_GROUP)
