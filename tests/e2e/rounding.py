"""Prompts whose outputs do not hang on rounding, for tests that compare two runs token for token.

A stream resumed after a fault recomputes its prompt and its output so far in other prefill
chunks than its first run did, and a decode batch of other rows rounds its GEMMs otherwise:
the logits differ from the first run's in the last bits. That changes no token unless a
discrete choice sits on a near-tie such a difference flips: the indexer's k-th and (k+1)-th
entry, an expert's routing, the sampled token's place in the distribution. With the tiny
model's random weights it is rare but real: one prompt of test_reroute had its indexer's
64th and 65th scores 1 ulp apart (1.19e-7 at 1.73) at one of its 126 decode selections on an
AVX2 machine, and its stream diverged there whenever a fault made it prefill in other chunks.

So these tests first run their candidate prompts here, in one process, cold (no prefix cache),
with other prefill chunkings, batches and resumptions (VARIANTS), and keep only prompts whose
tokens agree across all of them. What the tests then check (the fault changes
nothing beyond such rounding) is unaffected: their prompts are drawn as before and only the
rounding-sensitive ones are skipped.
"""

from __future__ import annotations

import dataclasses

from deepring import LLM, SamplingParams
from deepring.config import EngineSpec
from deepring.core.build import build_engine

# The variants, each against all the prompts run together with the servers' prefill budget of
# 64: (prefill token budget, tokens of output resumed, prompts run in how many batches). Odd
# budgets cut the compressors' windows and the 128-token blocks at other places; a resumed
# request prefills its first output tokens with its prompt; halves batch other rows together.
VARIANTS = ((29, 0, 1), (23, 5, 2))


class RoundingCheck:
    """The tiny model in this process: `stable(prompts, ...)` keeps the prompts whose output
    does not depend on chunking, batching or resumption."""

    def __init__(self, max_model_len: int = 1024) -> None:
        self._chat = LLM("tiny", max_model_len=max_model_len, max_num_seqs=1)
        spec = EngineSpec(
            model="tiny",
            max_model_len=max_model_len,
            max_num_seqs=16,
            prefix_cache=False,
            cpu_threads=2,
        )
        self._engine = build_engine(spec).engine
        self._rids = iter(range(1, 1 << 62))

    def _ids(self, prompt: str) -> list[int]:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "thinking": {"type": "disabled"},
        }
        return self._chat.encode(body)

    def _run(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        budget: int,
        done: list[list[int]] | None = None,
    ) -> list[list[int]]:
        eng = self._engine
        eng.scheduler.config = dataclasses.replace(
            eng.scheduler.config, max_num_batched_tokens=budget
        )
        reqs = [
            eng.add(next(self._rids), ids, params, params.seed or 0, output_ids=d)
            for ids, d in zip(prompts, done or [None] * len(prompts), strict=True)
        ]
        for _ in range(100_000):
            if not eng.has_work:
                break
            eng.step()
        return [list(r.output_ids) for r in reqs]

    def stable(
        self, prompts: list[str], want: int, max_tokens: int, sampling: dict | None = None
    ) -> list[str]:
        """The first `want` of `prompts` whose tokens (max_tokens of them, sampled as the
        OpenAI fields of `sampling` say; greedy without) are the same in every variant."""
        s = sampling or {"temperature": 0}
        params = SamplingParams(
            temperature=s.get("temperature", 1.0),
            seed=s.get("seed"),
            frequency_penalty=s.get("frequency_penalty", 0.0),
            presence_penalty=s.get("presence_penalty", 0.0),
            max_tokens=max_tokens,
        )
        ids = [self._ids(p) for p in prompts]
        ref = self._run(ids, params, 64)
        # (an output that ends before the longest resumption cannot be resumed: not kept)
        ok = [len(r) > max(v[1] for v in VARIANTS) for r in ref]
        for budget, k, parts in VARIANTS:
            for part in range(parts):
                js = range(part, len(ids), parts)
                done = [ref[j][: min(k, len(ref[j]) - 1)] for j in js] if k else None
                got = self._run([ids[j] for j in js], params, budget, done)
                for j, g in zip(js, got, strict=True):
                    ok[j] = ok[j] and g == ref[j]
        kept = [p for p, o in zip(prompts, ok, strict=True) if o]
        if len(kept) < want:
            raise AssertionError(f"only {len(kept)} of {len(prompts)} prompts are rounding-stable")
        return kept[:want]
