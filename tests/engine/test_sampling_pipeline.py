"""Penalties, min_p, top_k and log probabilities across the serving pipeline (prefill role ->
handoff -> decode role, every message through the codec) equal offline generation; and a
request resumed on other workers after a fault (a Submit carrying its output so far, as the
frontend's reroute sends it) continues with the same tokens and log probabilities."""

from __future__ import annotations

import numpy as np
import pytest
from deepring import LLM, SamplingParams
from deepring.config import EngineSpec
from deepring.core.build import build_engine
from deepring.frontend.requests import LogprobReader
from deepring.ipc import codec
from deepring.ipc.messages import Handoff, Submit, Tokens
from deepring.worker.roles import DecodeRole, PrefillRole

GEN = 3
ADDR = "ipc:///nowhere/handoff-0"
SPEC = EngineSpec(model="tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96)


def _wire(msg):
    return codec.decode_strict([bytes(f) for f in codec.encode(msg)])


class Link:
    def __init__(self) -> None:
        self.frontend: list[Tokens] = []
        self.handoffs: list[Handoff] = []

    def to_frontend(self, msg, link: int = 0) -> None:
        self.frontend.append(_wire(msg))

    def handoff(self, addr: str, msg: Handoff) -> None:
        self.handoffs.append(_wire(msg))


class Stream:
    """Tokens and log probabilities per request, as the frontend reads them."""

    def __init__(self) -> None:
        self.tokens: dict[int, dict[int, tuple]] = {}

    def feed(self, msgs: list[Tokens]) -> None:
        for m in msgs:
            assert not m.errors
            lps = LogprobReader(m) if m.logprob_k else None
            pos = 0
            for i, (rid, off, n) in enumerate(zip(m.rids, m.offsets, m.counts, strict=True)):
                got = lps.take(i, n) if lps is not None else None
                for j in range(n):
                    lp = got[j] if got is not None else None
                    self.tokens.setdefault(rid, {})[off + j] = (int(m.token_ids[pos + j]), lp)
                pos += n

    def output(self, rid: int) -> tuple[list[int], list]:
        got = self.tokens[rid]
        assert sorted(got) == list(range(len(got)))
        return [got[i][0] for i in range(len(got))], [got[i][1] for i in range(len(got))]


def _submit(rid: int, ids: list[int], params: SamplingParams, seed: int, num_output: int = 0):
    return _wire(
        Submit(
            rid=rid, prompt_ids=np.asarray(ids, dtype=np.int32), sampling=params, seed=seed,
            decode_worker="decode-0", decode_gen=GEN, decode_addr=ADDR, cache_class="chat",
            num_output=num_output,
        )
    )  # fmt: skip


def _serve(submits: list[Submit]) -> Stream:
    link = Link()
    pre = PrefillRole(build_engine(SPEC).engine, link, "prefill-0", 5)
    dec = DecodeRole(build_engine(SPEC).engine, link, "decode-0", GEN)
    for s in submits:
        pre.handle(s)
    stream = Stream()
    for _ in range(10_000):
        if not (pre.busy or dec.busy or link.handoffs):
            return stream
        if pre.busy:
            pre.step()
        stream.feed(link.frontend)
        link.frontend = []
        for h in link.handoffs:
            dec.handle(h)
        link.handoffs = []
        if dec.busy:
            dec.step()
        stream.feed(link.frontend)
        link.frontend = []
    raise AssertionError("did not finish")


def _prompt(n: int, salt: int) -> list[int]:
    return [(31 * j + 89 * salt) % 120000 + 3 for j in range(n)]


PARAMS = [
    SamplingParams(temperature=0, max_tokens=10, logprobs=3, frequency_penalty=-2.0),
    SamplingParams(temperature=0.8, top_k=50, min_p=0.02, seed=4, max_tokens=9, logprobs=2,
                   presence_penalty=1.0, frequency_penalty=0.5),
    SamplingParams(temperature=1.1, top_p=0.9, seed=7, max_tokens=8, presence_penalty=-1.5),
    SamplingParams(temperature=0, max_tokens=7, logprobs=0),
]  # fmt: skip
PROMPTS = [_prompt(n, i) for i, n in enumerate((20, 130, 45, 70))]


@pytest.fixture(scope="module")
def offline(deepring_cache_dir):
    llm = LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=96)
    return llm.generate(PROMPTS, PARAMS)


def _close(got: list, want: list | None) -> None:
    if want is None:
        assert all(g is None for g in got)
        return
    for (glp, gtop), (wlp, wtop) in zip(got, want, strict=True):
        assert glp == pytest.approx(wlp, abs=1e-5)  # float32 on the ring
        assert [t for t, _ in gtop] == [t for t, _ in wtop]
        assert [v for _, v in gtop] == pytest.approx([v for _, v in wtop], abs=1e-5)


def test_pipeline_equals_offline_generation(offline):
    pairs = enumerate(zip(PROMPTS, PARAMS, strict=True))
    stream = _serve([_submit(i, p, sp, sp.seed or 0) for i, (p, sp) in pairs])
    for i, want in enumerate(offline):
        ids, lps = stream.output(i)
        assert ids == want.token_ids
        _close(lps, want.logprobs)


@pytest.mark.parametrize("cut", [1, 4])
def test_a_resumed_request_continues_exactly(offline, cut):
    """What the frontend's reroute sends after `cut` tokens were streamed: the prompt plus those
    tokens (num_output = cut). The rest, penalties (counted over all the output, the resumed
    part included) and log probabilities included, is what the lost worker would have sent."""
    submits = []
    for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS, strict=True)):
        done = offline[i].token_ids[:cut]
        submits.append(_submit(100 + i, p + done, sp, sp.seed or 0, num_output=cut))
    stream = _serve(submits)
    for i, want in enumerate(offline):
        got = stream.tokens[100 + i]
        assert sorted(got) == list(range(cut, len(want.token_ids)))
        ids = [got[k][0] for k in sorted(got)]
        assert ids == want.token_ids[cut:]
        lps = [got[k][1] for k in sorted(got)]
        _close(lps, want.logprobs[cut:] if want.logprobs is not None else None)
