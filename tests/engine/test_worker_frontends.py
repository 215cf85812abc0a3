"""Workers shared by several frontends, driven message by message: two frontends that use the
same request ids get their own outputs (identical to offline generation), aborts and a lost
frontend touch only that frontend's requests, and a handoff finds its frontend by the
frontend's incarnation."""

from __future__ import annotations

import dataclasses

import numpy as np
from deepring import LLM, SamplingParams
from deepring.config import EngineSpec
from deepring.core.build import build_engine
from deepring.ipc import codec
from deepring.ipc.messages import Abort, Handoff, Submit, Tokens
from deepring.worker.roles import DecodeRole, PrefillRole

DECODE_GEN = 77
FRONTENDS = {0: 1001, 1: 2002}  # link -> that frontend's incarnation


def _wire(msg):
    return codec.decode_strict([bytes(f) for f in codec.encode(msg)])


class Links:
    """Two frontends' inboxes and the handoffs in flight."""

    def __init__(self) -> None:
        self.frontend: dict[int, list[Tokens]] = {0: [], 1: []}
        self.handoffs: list[Handoff] = []

    def to_frontend(self, msg, link: int = 0) -> None:
        self.frontend[link].append(_wire(msg))

    def handoff(self, addr: str, msg: Handoff) -> None:
        self.handoffs.append(_wire(msg))


def _submit(rid: int, prompt: list[int], params: SamplingParams) -> Submit:
    return _wire(
        Submit(
            rid=rid,
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            sampling=params,
            seed=params.seed or 0,
            decode_worker="decode-0",
            decode_gen=DECODE_GEN,
            decode_addr="ipc:///nowhere/handoff-0",
            cache_class="chat",
            num_output=0,
        )
    )


def _outputs(msgs: list[Tokens]) -> tuple[dict[int, list[int]], dict, dict]:
    tokens: dict[int, dict[int, int]] = {}
    finished, errors = {}, {}
    for m in msgs:
        pos = 0
        for rid, off, n in zip(m.rids, m.offsets, m.counts, strict=True):
            for i in range(n):
                tokens.setdefault(rid, {})[off + i] = int(m.token_ids[pos + i])
            pos += n
        finished.update({rid: (reason, total) for rid, reason, total in m.finished})
        errors.update({rid: message for rid, message in m.errors})
    ids = {rid: [got[i] for i in sorted(got)] for rid, got in tokens.items()}
    return ids, finished, errors


SPEC = EngineSpec(
    model="tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=96, zero_cost=True
)


def _workers(links: Links, num_links: int = 2):
    pre = PrefillRole(build_engine(SPEC).engine, links, "prefill-0", 5)
    dec = DecodeRole(build_engine(SPEC).engine, links, "decode-0", DECODE_GEN)
    for role in (pre, dec):
        role.num_links = num_links
        for link in range(num_links):
            role.frontend_heard(link, FRONTENDS[link])
    return pre, dec


def _run(links: Links, pre: PrefillRole, dec: DecodeRole) -> None:
    for _ in range(2000):
        if not (pre.busy or dec.busy):
            return
        if pre.busy:
            pre.step()
        handoffs, links.handoffs = links.handoffs, []
        for h in handoffs:
            dec.handle(h)
        if dec.busy:
            dec.step()
    raise AssertionError("did not finish")


def _prompt(n: int, salt: int) -> list[int]:
    return [(17 * j + 101 * salt) % 120000 + 3 for j in range(n)]


def test_two_frontends_with_the_same_request_ids_get_their_own_outputs(deepring_cache_dir):
    tiny = dataclasses.replace(SPEC, zero_cost=False)
    links = Links()
    pre = PrefillRole(build_engine(tiny).engine, links, "prefill-0", 5)
    dec = DecodeRole(build_engine(tiny).engine, links, "decode-0", DECODE_GEN)
    for role in (pre, dec):
        role.num_links = 2
        role.frontend_heard(0, FRONTENDS[0])
        role.frontend_heard(1, FRONTENDS[1])
    prompts = {0: [_prompt(40, 1), _prompt(7, 2)], 1: [_prompt(90, 3), _prompt(12, 4)]}
    params = [
        SamplingParams(temperature=0, max_tokens=6),
        SamplingParams(temperature=0.9, seed=3, max_tokens=5),
    ]
    for link in (0, 1):
        for rid in (0, 1):  # both frontends number their requests 0 and 1
            pre.handle(_submit(rid, prompts[link][rid], params[rid]), link)
    _run(links, pre, dec)
    llm = LLM("tiny", max_num_seqs=4, max_model_len=512, max_num_batched_tokens=96)
    for link in (0, 1):
        want = [o.token_ids for o in llm.generate(prompts[link], params)]
        ids, finished, errors = _outputs(links.frontend[link])
        assert not errors
        assert [ids[0], ids[1]] == want
        assert finished == {0: ("length", 6), 1: ("length", 5)}
    assert len(pre.origins) == len(dec.origins) == 0


def test_an_abort_and_a_lost_frontend_touch_only_that_frontends_requests():
    links = Links()
    pre, dec = _workers(links)
    long = SamplingParams(max_tokens=400, ignore_eos=True)
    for link in (0, 1):
        for rid in (5, 6):
            pre.handle(_submit(rid, _prompt(30, rid + link), long), link)
    while pre.busy:
        pre.step()
    for h in links.handoffs:
        dec.handle(h)
    links.handoffs = []
    dec.step()
    assert len(dec.engine.requests) == 4
    # Frontend 1 aborts its request 5: frontend 0's request 5 runs on.
    dec.handle(_wire(Abort(rids=[5], reason="client disconnected")), 1)
    assert sorted(dec.origins.get(r.rid) for r in dec.engine.requests.values()) == [
        (0, 5),
        (0, 6),
        (1, 6),
    ]
    # Frontend 0 is lost: its requests go, frontend 1's stay.
    dropped = dec.reset(0)
    assert len(dropped) == 2
    assert [dec.origins.get(r.rid) for r in dec.engine.requests.values()] == [(1, 6)]
    for msgs in links.frontend.values():
        msgs.clear()
    dec.step()
    ids, _, _ = _outputs(links.frontend[1])
    assert list(ids) == [6]
    assert not links.frontend[0]


def test_a_handoff_finds_its_frontend_by_incarnation():
    links = Links()
    pre, dec = _workers(links)
    pre.handle(_submit(9, _prompt(10, 1), SamplingParams(max_tokens=4)), 1)
    pre.step()
    (h,) = links.handoffs
    assert (h.rid, h.frontend_gen) == (9, FRONTENDS[1])
    links.frontend[1].clear()
    # The decode worker has not heard from that frontend yet: the handoff waits for it.
    dec.frontend_gens.pop(1)
    dec.handle(h)
    assert not dec.busy
    assert len(dec.unplaced) == 1
    dec.frontend_heard(1, FRONTENDS[1])
    assert dec.busy
    assert not dec.unplaced
    while dec.busy:
        dec.step()
    ids, finished, _ = _outputs(links.frontend[1])
    assert len(ids[9]) == 3
    assert finished[9][0] == "length"
    assert not links.frontend[0]
    # One that never hears from its frontend is dropped after the wait.
    dec.frontend_gens.pop(1)
    dec.handle(dataclasses.replace(h, rid=10))
    dec.expire(float("inf"))
    assert not dec.unplaced
    assert not dec.busy


def test_with_one_frontend_a_handoff_of_its_predecessor_is_dropped():
    links = Links()
    pre, dec = _workers(links, num_links=1)
    pre.handle(_submit(3, _prompt(10, 1), SamplingParams(max_tokens=4)), 0)
    pre.step()
    (h,) = links.handoffs
    dec.frontend_heard(0, 999)  # the frontend restarted since the request was routed
    dec.handle(h)
    assert not dec.busy
    # A prefill worker that had not heard its frontend's incarnation sends 0: accepted.
    dec.handle(dataclasses.replace(h, frontend_gen=0))
    assert dec.busy


def test_a_frontend_cannot_submit_the_same_id_twice():
    links = Links()
    pre, _ = _workers(links)
    pre.handle(_submit(4, _prompt(10, 1), SamplingParams(max_tokens=4)), 0)
    pre.handle(_submit(4, _prompt(10, 2), SamplingParams(max_tokens=4)), 0)
    pre.handle(_submit(4, _prompt(10, 3), SamplingParams(max_tokens=4)), 1)  # another frontend
    _, _, errors = _outputs(links.frontend[0])
    assert errors == {4: "prefill-0 already holds this request id"}
    assert len(pre.engine.requests) == 2
