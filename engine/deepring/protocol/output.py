"""A request's engine output (token ids, a finish reason) into its protocol events.

The request's StreamProcessor does the decoding and the reasoning / content / tool-call parsing
and matches stop sequences; this feeds it. The engine stops on EOS or a stop token id and keeps
that token in its output; the protocol layer would print it as text, so it is dropped here (as
vLLM leaves a stop token out of the text; it is not counted in the usage either).
"""

from __future__ import annotations

from deepring_recipe import InferenceChunk, InferenceFinishReason, PromptUsage

from deepring.protocol.prepare import Prepared
from deepring.sampling.params import TokenLogprob


def ready_events(prep: Prepared, cache_hit: int) -> list:
    """The events that open the response (cache_hit prompt tokens were served from cache)."""
    usage = PromptUsage(prompt_tokens=len(prep.prompt_ids), prompt_cache_hit_tokens=cache_hit)
    return prep.processor.push(InferenceChunk.ready(prompt_usage=usage))


def token_events(
    prep: Prepared,
    ids: list[int],
    finish: str | None,
    eos_ids: frozenset[int],
    logprobs: list[TokenLogprob] | None = None,
) -> tuple[list, bool]:
    """Events for new tokens (and the end, with finish "stop" | "length"); True when the
    response is over (finished, or a stop sequence matched). logprobs: one per id, for a
    request that asked for them (the processor attaches each to the text its token produced).
    RuntimeError from the processor when the output cannot be processed."""
    proc = prep.processor
    if finish == "stop" and ids and (ids[-1] in eos_ids or ids[-1] in prep.params.stop_token_ids):
        ids = ids[:-1]
        if logprobs:
            logprobs = logprobs[:-1]
    events = proc.push(InferenceChunk.tokens(ids, logprobs or None)) if ids else []
    if proc.finished:  # a stop sequence matched: the processor ended the stream itself
        return events, True
    if finish is not None:
        reason = InferenceFinishReason.Length if finish == "length" else InferenceFinishReason.Stop
        events += proc.push(InferenceChunk.finish(reason))
        events += proc.finish()
        return events, True
    return events, False
