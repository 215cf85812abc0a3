"""Running one stream case under several chunkings: what must not depend on the chunking."""

from __future__ import annotations

import json
import re
from typing import Any

from .common import canonical_json


def strip_usage(value: Any) -> Any:
    """Replace every non-null `usage` object by a marker (token counts depend on how far a
    stream got before a stop sequence, and on text vs token-id input)."""
    if isinstance(value, dict):
        return {
            k: ("<usage>" if k == "usage" and v is not None else strip_usage(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_usage(v) for v in value]
    return value


def strip_logprobs(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("<logprobs>" if k == "logprobs" else strip_logprobs(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_logprobs(v) for v in value]
    return value


def stream_view(result: dict, *, keep_usage: bool, keep_logprobs: bool) -> dict:
    """The part of a `run_stream` result that must not depend on the chunking."""
    keys = (
        "parsing",
        "text",
        "events",
        "accumulated",
        "error",
        "problems",
        "finished",
        "push_after_finish",
    )
    view = {k: result[k] for k in keys}
    if not keep_usage:
        view = strip_usage(view)
    if not keep_logprobs:
        view = strip_logprobs(view)
    return view


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class ByteTokens:
    """Explodes token ids into single-byte tokens (the byte-level BPE alphabet) while keeping
    added tokens (the special tokens) as they are: the ids a model could emit for the same text
    if every multi-byte character and every word were split into bytes. The official processor
    matches `</think>` and `｜DSML｜` only as special token ids in token input, so special tokens
    must stay whole for token input to mean the same as text input."""

    def __init__(self, tokenizer_json: str) -> None:
        with open(tokenizer_json, encoding="utf-8") as handle:
            data = json.load(handle)
        printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        alphabet: dict[int, str] = {b: chr(b) for b in printable}
        shift = 0
        for b in range(256):
            if b not in alphabet:
                alphabet[b] = chr(256 + shift)
                shift += 1
        vocab = data["model"]["vocab"]
        self.byte_id = [vocab[alphabet[b]] for b in range(256)]
        decode = {char: b for b, char in alphabet.items()}
        self.bytes_of = {
            i: bytes(decode[c] for c in token)
            for token, i in vocab.items()
            if all(c in decode for c in token)
        }
        self.added = {t["id"] for t in data["added_tokens"]}
        for token in data["added_tokens"]:
            self.bytes_of[token["id"]] = token["content"].encode()

    def silent_tail(self, ids: list[int]) -> bool:
        """Whether the ids end with tokens that produce no text: an id the tokenizer does not
        know, or bytes the decoder still holds at the end (as the official decoder holds them:
        the bytes of a token that is not valid UTF-8 on its own wait for the tokens that
        complete them, and become U+FFFD when a token valid on its own arrives first)."""
        known = [i for i in ids if self.bytes_of.get(i)]
        if ids and (not known or known[-1] != ids[-1]):
            return True
        pending = b""
        for i in ids:
            data = self.bytes_of.get(i, b"")
            if not data:
                continue
            if _valid_utf8(data):
                pending = b""
            else:
                pending += data
                if _valid_utf8(pending):
                    pending = b""
        return bool(pending)

    def explode(self, ids: list[int]) -> list[int]:
        out: list[int] = []
        for i in ids:
            if i in self.added or i not in self.bytes_of:
                out.append(i)
            else:
                out.extend(self.byte_id[b] for b in self.bytes_of[i])
        return out


def collapse_spaces(value: Any) -> Any:
    """Every run of spaces in every string reduced to one space."""
    if isinstance(value, dict):
        return {k: collapse_spaces(v) for k, v in value.items()}
    if isinstance(value, list):
        return [collapse_spaces(v) for v in value]
    if isinstance(value, str):
        return re.sub(" {2,}", " ", value)
    return value


def invariance_problems(
    results: list[tuple[dict, dict, str]], *, json_mode: bool = False, cross_input: bool = True
) -> list[str]:
    """Differences between the runs of one output under different chunkings.

    `results` holds (plan, run_stream result, usage class) with the "whole" text chunking
    first. Runs of one usage class must agree on everything (usage too, unless a stop sequence
    ended either run before the finish chunk); all runs of one input kind (text / token ids)
    must agree on everything but usage and logprobs. Text and token-id runs must agree on the
    reduced text (deltas, tool calls, finish) when `cross_input` (false under special-token
    overrides: token input matches markers only as special token ids), up to trailing
    newlines of each text: the official keeps one newline that follows a partial marker and
    precedes the real one in text input (`a<\\n\\n</think>` -> reasoning `a<\\n`) and drops it
    in token input (`a<`).

    Known chunking dependence of the official (see README): in JSON output mode the text
    around the JSON becomes one space *per pushed chunk*; `json_mode` compares with runs of
    spaces collapsed.
    """

    def view(result: dict, keep_usage: bool, keep_logprobs: bool) -> str:
        out = stream_view(result, keep_usage=keep_usage, keep_logprobs=keep_logprobs)
        return canonical_json(collapse_spaces(out) if json_mode else out)

    def cross_view(result: dict) -> str:
        out = strip_logprobs(strip_usage(result["text"]))
        out = canonical_json(collapse_spaces(out) if json_mode else out)
        return re.sub(r'(\\n)+"', '"', out)  # trailing newlines of every text

    problems = []
    first_of_class: dict[str, tuple[dict, dict]] = {}
    first_of_input: dict[str, tuple[dict, dict]] = {}
    base_plan, base, _ = results[0]
    for plan, result, klass in results:
        kind = "text" if klass == "text" else "ids"
        refs = []
        if klass in first_of_class:
            refs.append((*first_of_class[klass], True))
        else:
            first_of_class[klass] = (plan, result)
        if kind in first_of_input:
            refs.append((*first_of_input[kind], False))
        else:
            first_of_input[kind] = (plan, result)
        for ref_plan, ref, same_class in refs:
            keep = same_class and not (ref["stopped_early"] or result["stopped_early"])
            if view(ref, keep, same_class) != view(result, keep, same_class):
                problems.append(f"{plan} differs from {ref_plan}")
        if cross_input and kind != "text" and cross_view(base) != cross_view(result):
            problems.append(f"{plan} (token ids) differs from {base_plan} (text)")
    return problems
