"""DeepInfer 0.1.0's vision code as a test oracle for model.v41.vision (issue 21).

Loaded file by file from the pinned sdist (v41_oracle.sdist_root), as v41_oracle does:

- `models/vision_encoder/vit.py`: the ViT (its module constants set to a tiny tower's sizes
  before it is built; `device="cuda"` of its RoPE table replaced by the CPU, the one edit);
- `models/vision_encoder/mlp_projector.py`: the projector;
- `tilelang_ops/image_embed_ops.py`: `rgb_pad_to_patches_ref` and `batch_downsample_ref`, the
  in-tree torch references of the GPU kernels (pixels to patches; 3x3 merge);
- `ve/processor/image_processor.py::load_image_anyres`: the patch positions and the span's
  token types (PIL, which it imports for decoding, is stubbed: the function never uses it);
- `hugging_face/names.py::hf_to_model`: the checkpoint names of the tower's tensors.

The GPU kernels vit.py calls are replaced by plain torch with their documented semantics: the
GEMMs (deep_gemm: x @ w.T), varlen attention (flash-attn: per image, non-causal, 1/sqrt(d)),
SwiGLU (tile_kernels: silu of the first half times the second), RMSNorm with an optional fused
residual add (returning the sum as the next residual), and rotary embedding (tile_kernels'
apply_rotary, non-interleaved: rotate-half over the head with cos / sin of half its width, the
table's (cos, sin) halves). The structure, constants, RoPE table and position layout, residual
flow, merge order, projector and token layout are DeepInfer's own code.
"""

from __future__ import annotations

import itertools
import math
import sys
import types

import torch
import torch.nn.functional as F
import v41_oracle
from v41_oracle import _AnyMark, _stub

_LOADED: dict[str, types.ModuleType] = {}


def _load_source(name: str, path, edits: tuple[tuple[str, str], ...] = ()) -> types.ModuleType:
    if name in _LOADED:
        return _LOADED[name]
    src = path.read_text()
    for old, new in edits:
        if old not in src:
            raise AssertionError(f"{path.name} no longer contains {old!r}")
        src = src.replace(old, new)
    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    sys.modules[name] = mod
    # Its kernel tests' decorators: pytest.mark.* as the identity (as v41_oracle._load does).
    real_pytest = sys.modules.get("pytest")
    sys.modules["pytest"] = types.SimpleNamespace(mark=_AnyMark(), fixture=lambda *a, **k: (
        a[0] if a and callable(a[0]) else (lambda f: f)))  # fmt: skip
    try:
        exec(compile(src, str(path), "exec"), mod.__dict__)
    finally:
        if real_pytest is not None:
            sys.modules["pytest"] = real_pytest
    _LOADED[name] = mod
    return mod


def _gemm(x, w, out, _bias):
    out.copy_(x @ w.T)


def _flash(q, k, v, cu_seqlens_q, softmax_scale=None, causal=False, **_):
    assert not causal
    assert softmax_scale is None
    cu = [int(c) for c in cu_seqlens_q]
    out = torch.empty_like(q)
    for a, b in itertools.pairwise(cu):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
        att = torch.softmax(qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        out[a:b] = (att @ vs).transpose(0, 1)
    return (out,)


def _swiglu(gate, _dtype):
    h = gate.shape[1] // 2
    return F.silu(gate[:, :h]) * gate[:, h:]


def _rotary(q, rope, k, interleaved):
    assert not interleaved
    half = rope.shape[1] // 2
    cos, sin = rope[:, :half].unsqueeze(1), rope[:, half:].unsqueeze(1)
    for x in (q, k):
        d = x.shape[-1] // 2
        x1, x2 = x[..., :d].clone(), x[..., d:].clone()
        x[..., :d] = x1 * cos - x2 * sin
        x[..., d:] = x2 * cos + x1 * sin


def _norm(x, weight, residual=None, eps=1e-6):
    h = x if residual is None else x + residual
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight
    return y if residual is None else (y, h)


class _Timer:
    @staticmethod
    def record(_name):
        return lambda f: f


def vision() -> types.SimpleNamespace:
    root = v41_oracle.sdist_root()
    v41_oracle.deepinfer()  # the package namespace and the stubs it sets up
    base = root / "deepinfer"
    _stub("deep_gemm", cublaslt_gemm_nt=_gemm, bf16_gemm_nt=_gemm)
    _stub("flash_attn")
    _stub("flash_attn.cute")
    _stub("flash_attn.cute.interface", _flash_attn_fwd=_flash)
    _stub("tile_kernels.quant", swiglu_forward=_swiglu)
    _stub("tile_kernels.transform", apply_rotary=_rotary)
    _stub("tile_kernels.utils", dtype_to_str=str)
    _stub("deep_cluster")
    _stub("deep_cluster.hardware", accelerator_kind=lambda: "cuda", is_sm_major_10=lambda: False)
    _stub("deepinfer.model_executor.layers.tilelang_ops.norm", norm=_norm)
    _stub("deepinfer.timer", cpu_timer=_Timer())
    _stub("PIL", Image=types.SimpleNamespace(MAX_IMAGE_PIXELS=None), ImageOps=None)
    for sub in ("models", "models.vision_encoder"):
        _stub(f"deepinfer.model_executor.{sub}")
    _stub("deepinfer.ve", __path__=[str(base / "ve")])
    _stub("deepinfer.ve.processor", __path__=[str(base / "ve/processor")])
    _load_source("deepinfer.multimodal_tokens", base / "multimodal_tokens.py")
    _load_source("deepinfer.ve.processor.common", base / "ve/processor/common.py")
    vit = _load_source(
        "deepinfer.model_executor.models.vision_encoder.vit",
        base / "model_executor/models/vision_encoder/vit.py",
        (('dtype=torch.float, device="cuda")', 'dtype=torch.float, device="cpu")'),),
    )
    proj = _load_source(
        "deepinfer.model_executor.models.vision_encoder.mlp_projector",
        base / "model_executor/models/vision_encoder/mlp_projector.py",
    )
    embed_ops = _load_source(
        "deepinfer.model_executor.layers.tilelang_ops.image_embed_ops",
        base / "model_executor/layers/tilelang_ops/image_embed_ops.py",
    )
    processor = _load_source(
        "deepinfer.ve.processor.image_processor", base / "ve/processor/image_processor.py"
    )
    names = _load_source("deepinfer.hugging_face.names", base / "hugging_face/names.py")
    tokens = sys.modules["deepinfer.multimodal_tokens"]
    return types.SimpleNamespace(
        vit=vit, MlpProjector=proj.MlpProjector, AttrDict=sys.modules["deepinfer"].AttrDict,
        rgb_pad_to_patches_ref=embed_ops.rgb_pad_to_patches_ref,
        batch_downsample_ref=embed_ops.batch_downsample_ref,
        load_image_anyres=processor.load_image_anyres, TokenType=tokens.TokenType,
        hf_to_model=names.hf_to_model,
    )  # fmt: skip
