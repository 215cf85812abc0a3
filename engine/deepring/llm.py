"""Offline generation: `LLM(model=...).generate(prompts, SamplingParams(...))`.

Prompts may be token ids, text (tokenised with the model's tokenizer, BOS prepended), or chat
request bodies (OpenAI Chat Completions JSON, rendered through deepring_recipe; for a model with
a vision tower, with inline images: data URLs, image file parts; URLs are not fetched). All
prompts are queued at once and served with continuous batching: as requests finish, waiting
ones join the running batch.

Structured output: `generate(..., constraints=...)` takes a `Constraint` (for every prompt) or
one per prompt (None: unconstrained), made with `deepring.structured.build`: `json_schema(schema)`
(None: any JSON object), `regex(pattern)`, `lark(grammar)`. A chat request body brings its own
(response_format, tool_choice: as the server enforces it) unless one is given for it; its
fields are checked as the server checks them, and its sampling fields are refused (they come
from SamplingParams).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from deepring import env
from deepring.config import EngineSpec
from deepring.core.build import build_engine
from deepring.core.images import PromptImage, image_support
from deepring.model.embedded import is_embedded
from deepring.sampling.params import SamplingParams, TokenLogprob
from deepring.sampling.sampler import splitmix64
from deepring.structured.constraint import Constraint

if TYPE_CHECKING:
    from deepring.protocol.prepare import Offline, Recipe

Prompt = str | list[int] | dict[str, Any]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None  # None when the model has no tokenizer
    finish_reason: str  # "stop" | "length"
    # With SamplingParams(logprobs=k): one (logprob, [(id, logprob)] x k) per output token, the
    # sampled token's log probability and the k most likely tokens (sampling.sampler says of
    # which distribution); None otherwise.
    logprobs: list[TokenLogprob] | None = None


class LLM:
    def __init__(
        self,
        model: str | Path = "tiny",
        *,
        tokenizer: str | Path | None = None,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        load_format: str = "auto",
        quantised: str = "auto",
        seed: int = 0,
        max_model_len: int = 4096,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int | None = None,
        num_blocks: int | None = None,
        block_size: int = 128,
        progress: bool = False,
        speculative: str = "off",
        overlap: bool = False,
    ) -> None:
        """speculative: off | mtp | fixed:N | dspark (core.speculative; the output is the
        same either way, only faster or slower). quantised: auto | keep | dequantise, what
        happens to a checkpoint's FP8 / MXFP4 weights (model.loader.keeps_quantised).
        overlap: step the engine one step ahead (core.overlap: the next step is planned while
        one computes; the same outputs), as serving workers do."""
        if max_num_batched_tokens is None:
            # Offline work is throughput-bound: a step's token budget of a whole prompt at least,
            # and 4096 (DeepInfer's default rule). Serving keeps its smaller, latency-bound one.
            max_num_batched_tokens = max(max_model_len, 4096)
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        spec = EngineSpec(
            model=str(model),
            device=str(device) if device is not None else None,
            dtype=dtype,
            load_format=load_format,
            quantised=quantised,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            num_blocks=num_blocks,
            block_size=block_size,
            cpu_threads=env.cpu_threads(),
            speculative=speculative,
        )
        built = build_engine(spec, progress=progress)
        self.engine = built.engine
        self.model = built.model
        self.config = built.config
        self.name = spec.model if is_embedded(spec.model) else Path(spec.model).name
        self.tokenizer = None
        tok_path = Path(tokenizer) if tokenizer is not None else built.path
        if tok_path is not None:
            tok_file = tok_path / "tokenizer.json" if tok_path.is_dir() else tok_path
            if tok_file.is_file():
                from deepring.protocol.tokenizer import load_tokenizer

                self.tokenizer = load_tokenizer(tok_file)
                self.engine.tokenizer_path = tok_file
            elif tokenizer is not None:
                raise ValueError(f"no tokenizer.json at {tok_file}")
        self._recipe: Recipe | None = None
        self._overlap = None
        if overlap:
            from deepring.core.overlap import Overlapped

            self._overlap = Overlapped(self.engine)
        self._seed = seed
        self._counter = itertools.count()

    # ---- prompts -------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        return self._encode(prompt)[0]

    def _encode(self, prompt: Prompt) -> Offline:
        """The prompt's ids, and the constraint, SamplingParams fields and images a chat body
        brings."""
        from deepring.protocol.prepare import Offline

        if isinstance(prompt, dict):
            return self._chat_ids(prompt)
        if isinstance(prompt, str):
            ids = self._require_tokenizer().encode(prompt)
            bos = self.config.bos_token_id
            return Offline(([bos] if bos is not None else []) + ids, None, {})
        if isinstance(prompt, (list, tuple)) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return Offline(list(prompt), None, {})
        raise ValueError(
            f"a prompt is text, a list of token ids or a chat request body, got {prompt!r:.80}"
        )

    def _chat_ids(self, body: dict[str, Any]) -> Offline:
        """A Chat Completions body rendered with this model's template (the body's `model`
        must name this model), its output constraint, the SamplingParams fields it implies
        (a thinking budget) and its images (inline ones: image URLs are not fetched). Its
        fields are checked as the server checks them; sampling fields are refused:
        generate's SamplingParams carry them."""
        from deepring.protocol.errors import ApiError
        from deepring.protocol.formats import PromptFormat
        from deepring.protocol.images import ImageSupport
        from deepring.protocol.prepare import CHAT, Recipe

        if self._recipe is None:
            fmt = PromptFormat.of_model_type(self.config.model_type)
            support = image_support(self.model)
            images = ImageSupport(self.engine.vocab_size) if isinstance(support, dict) else support
            self._recipe = Recipe(self._require_tokenizer(), [self.name], fmt, images=images)
        try:
            return self._recipe.encode_offline(CHAT, body)
        except ApiError as e:
            raise ValueError(f"chat request rejected: {e.message}") from None

    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids, or LLM(tokenizer=...)")
        return self.tokenizer

    # ---- generation ----------------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        constraints: Constraint | Sequence[Constraint | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt. constraints: the grammar each output must match (one for
        all, or one per prompt; see the module's doc)."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple))
            and prompts
            and all(isinstance(t, int) for t in prompts)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        given = (
            [constraints] * len(prompts)
            if constraints is None or isinstance(constraints, Constraint)
            else list(constraints)
        )
        if len(given) != len(prompts):
            raise ValueError(f"{len(given)} constraints for {len(prompts)} prompts")
        encoded = [self._encode(p) for p in prompts]
        order = []
        try:
            for (ids, own, implied, images), p, c in zip(encoded, params, given, strict=True):
                if implied:
                    p = dataclasses.replace(p, **implied)
                n = next(self._counter)
                seed = p.seed if p.seed is not None else splitmix64(self._seed * 1_000_003 + n)
                order.append(
                    self.engine.add(
                        n, ids, p, seed, constraint=c or own,
                        images=[PromptImage.from_encoded(im) for im in images],
                    )
                )  # fmt: skip
        except ValueError:
            for req in order:  # all or nothing: a bad prompt leaves no request behind
                self.engine.abort(req.rid)
            raise
        t0 = time.monotonic()
        done = 0
        logprobs: dict[int, list[TokenLogprob]] = {
            r.rid: [] for r in order if r.params.logprobs is not None
        }
        ov = self._overlap
        while ov.busy if ov is not None else self.engine.has_work:
            for r in ov.step() if ov is not None else self.engine.step():
                done += r.finished
                if r.logprobs is not None:
                    logprobs[r.request.rid].append(r.logprobs)
            if use_tqdm:
                print(
                    f"\rgenerate: {done}/{len(order)} done, {time.monotonic() - t0:.1f}s",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        if use_tqdm:
            print(file=sys.stderr)
        return [
            RequestOutput(
                request_id=f"req-{r.rid}",
                prompt_token_ids=r.prompt_ids,
                token_ids=r.output_ids,
                text=self.tokenizer.decode(r.output_ids) if self.tokenizer is not None else None,
                finish_reason=r.finish_reason or "abort",
                logprobs=logprobs.get(r.rid),
            )
            for r in order
        ]
