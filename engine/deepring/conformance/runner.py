"""A conformance run: hypothesis draws request bodies of each protocol (the strategies of
deepring.conformance.bodies, valid and deliberately invalid), checks.Checker sends them, and
every property's outcome goes into a Report.

A survey checks every property on every example and records each failure, raising nothing
(hypothesis stops generating soon after a failure). Then each failing property is shrunk on
its own: the survey is replayed (same seed, same examples) up to the first example that
failed it, which now raises that property's own exception, and hypothesis shrinks it, within
`max_shrinks` examples since each one is a few round trips to the server. The report keeps
the smallest failing request of each property. After the generated bodies, a few
grammar-bounded ones (bodies.bounded) give the tool-choice and response-format properties
finished outputs. Each protocol runs in `concurrency` threads, each with its share of the
examples under its own seed (the server batches their requests).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from deepring.conformance import outputs, variants
from deepring.conformance.bodies import request_cases
from deepring.conformance.bodies.bounded import bounded_cases
from deepring.conformance.checks import Checker, Gate, Target
from deepring.conformance.oracle import Oracle
from deepring.conformance.properties import NAMES, PROPERTIES, Verdicts
from deepring.conformance.report import Report
from deepring.conformance.wire import Client

PROTOCOLS = ("chat", "responses", "messages")
_REPORT_LOCK = threading.Lock()  # the report is shared by the protocols' threads
# Grammar-bounded examples per protocol by default: one per BOUNDED_SHARE generated ones, at
# least BOUNDED_MIN (each of the three kinds, json_schema / required / named, likely drawn).
BOUNDED_SHARE = 20
BOUNDED_MIN = 6


def default_bounded(examples: int) -> int:
    return max(BOUNDED_MIN, examples // BOUNDED_SHARE)


class PropertyFailed(Exception):
    """An example failed a property; each property has its own subclass (`_FAILURES`)."""


_FAILURES = {name: type(f"{name}_failed", (PropertyFailed,), {}) for name in NAMES}

# What hypothesis may raise at the end of a shrinking replay (the failures are in the report
# already): the shrunk failure, or "flaky" (an exception group) when it passed when replayed
# last (a server is no pure function, and past max_shrinks examples pass).
try:
    _END_OF_RUN: tuple[type[BaseException], ...] = (
        PropertyFailed,
        HypothesisException,
        ExceptionGroup,
    )
except NameError:  # Python 3.10: hypothesis raises the exceptiongroup backport's class
    from exceptiongroup import ExceptionGroup as _Group  # type: ignore[import-not-found]

    _END_OF_RUN = (PropertyFailed, HypothesisException, _Group)


@dataclass
class Plan:
    protocols: tuple[str, ...] = PROTOCOLS
    examples: int = 100  # per protocol
    seed: int | None = None  # hypothesis' seed (None: a random one, reported)
    max_shrinks: int = 30
    bounded: int | None = None  # grammar-bounded examples per protocol (None: default_bounded)
    # Threads per protocol, each with its share of the examples (its own hypothesis seed):
    # a server batches concurrent requests, so more in flight run faster.
    concurrency: int = 2


def _settings(examples: int, phases: tuple[Phase, ...]) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def discover(target: Target) -> list[str]:
    """Fill in what the server tells about itself (model, context length); notes for the
    report."""
    notes = []
    client = Client(target.base_url, target.api_key, target.timeout)
    try:
        models = client.get_json("/v1/models")
    finally:
        client.close()
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    if target.model is None:
        if not isinstance(first.get("id"), str):
            raise ValueError("GET /v1/models names no model: pass --model")
        target.model = first["id"]
        notes.append(f"model {first['id']!r} (from GET /v1/models)")
    if target.context_length is None and isinstance(first.get("max_model_len"), int):
        target.context_length = first["max_model_len"]
        notes.append(f"context length {target.context_length} (max_model_len of GET /v1/models)")
    return notes


def probe_thinking(target: Target, model: str, protocol: str) -> str:
    """The server's thinking mode for requests that do not choose: a thinking model's output
    starts as reasoning (its prompt ends inside <think>), so a short answer to a request
    without a thinking field has reasoning exactly when the default is on. A note for the
    report."""
    client = Client(target.base_url, target.api_key, target.timeout)
    try:
        ex = client.post(protocol, variants.text_body(protocol, model, "Say hello.", 4))
    finally:
        client.close()
    if not ex.ok:
        return f"default thinking mode unknown (the probe got HTTP {ex.status or ex.error})"
    out = outputs.from_body(protocol, ex.json)
    if not (out.content or out.reasoning or out.tool_calls):
        return "default thinking mode unknown (the probe's answer was empty)"
    target.default_thinking = bool(out.reasoning)
    mode = "on" if target.default_thinking else "off"
    return f"default thinking {mode} (probed: a request without a thinking field)"


def _share(total: int, parts: int, part: int) -> int:
    """Part `part` of `total` split in `parts` (the first parts take the remainder)."""
    return total // parts + (part < total % parts)


class _Part:
    """One thread of a protocol's run (`Plan.concurrency` per protocol): its share of the
    examples under its own hypothesis seed, and the bookkeeping."""

    def __init__(
        self,
        target: Target,
        protocol: str,
        part: int,
        oracle: Oracle,
        plan: Plan,
        report: Report,
        gate: Gate,
        claimed: set[tuple[str, str]],
    ):
        self.checker = Checker(target, protocol, oracle, gate)
        self.protocol = protocol
        self.part = part
        self.plan = plan
        self.report = report
        # (property, protocol) that a part shrinks: one part each, the first to get there
        self.claimed = claimed

    def record(self, v: Verdicts) -> None:
        with _REPORT_LOCK:
            for name in v.applied:
                o = self.report.outcome(name, self.protocol)
                o.checked += 1
                if name in v.failed:
                    o.record_failure(*v.failed[name])

    def run(self, seed: int) -> tuple[int, float, int]:
        """The suite's generated bodies, then a few whose output a grammar bounds
        (bodies.bounded): the tool-choice and response-format properties need finished outputs,
        which the generated bodies rarely ask for. Few, since each is tens of tokens.
        (examples run, seconds, load-dependent pairs)."""
        started = time.monotonic()
        if self.part == 0:
            self.fixed()
        parts, seed = self.plan.concurrency, seed + self.part
        examples = _share(self.plan.examples, parts, self.part)
        count = self._hypothesis(request_cases(self.protocol), examples, seed) if examples else 0
        bounded = self.plan.bounded
        if bounded is None:
            bounded = default_bounded(self.plan.examples)
        bounded = _share(bounded, parts, self.part)
        if bounded > 0:
            count += self._hypothesis(bounded_cases(self.protocol), bounded, seed)
        self.checker.close()
        return count, time.monotonic() - started, self.checker.load_dependent

    def _hypothesis(self, strategy: st.SearchStrategy, examples: int, seed: int) -> int:
        """`examples` examples of the strategy, every property checked on each and every
        failure recorded; then each failing property shrunk on its own. How many ran.

        Nothing is raised while surveying: hypothesis stops generating soon after a test
        fails, and one property's failure must not cut the others' examples short."""
        first: dict[str, int] = {}  # property: the index of the first example it failed
        index = 0

        @_settings(examples, (Phase.generate,))
        @given(strategy)
        def survey(case: dict) -> None:
            nonlocal index
            v = self.checker.example(case["body"], case.get("max_tokens"))
            self.record(v)
            for name in v.failed:
                first.setdefault(name, index)
            index += 1

        hypothesis_seed(seed)(survey)()
        for name in NAMES:
            if name in first and self.plan.max_shrinks > 0 and self._claim(name):
                self._shrink(strategy, examples, seed, name, first[name])
        return index

    def _claim(self, name: str) -> bool:
        with _REPORT_LOCK:
            if (name, self.protocol) in self.claimed:
                return False
            self.claimed.add((name, self.protocol))
            return True

    def _shrink(
        self, strategy: st.SearchStrategy, examples: int, seed: int, name: str, at: int
    ) -> None:
        """Replay the survey (the same seed and max_examples draw the same examples in the
        same order; another max_examples would not) without sending the examples before `at`,
        the first that failed `name`; from there on, fail on `name` alone so that hypothesis
        shrinks it, for at most max_shrinks examples. Best effort: when the replayed example
        passes this time, the survey's smallest failure stands."""
        index = spent = 0

        @_settings(examples, (Phase.generate, Phase.shrink))
        @given(strategy)
        def replay(case: dict) -> None:
            nonlocal index, spent
            index += 1
            if index <= at or spent >= self.plan.max_shrinks:
                return
            spent += 1
            v = self.checker.example(case["body"], case.get("max_tokens"))
            if name in v.failed:
                with _REPORT_LOCK:
                    self.report.outcome(name, self.protocol).consider(*v.failed[name])
                raise _FAILURES[name](v.failed[name][0])

        with contextlib.suppress(*_END_OF_RUN):  # recorded above
            hypothesis_seed(seed)(replay)()

    def fixed(self) -> None:
        """The checks that run once: a prompt beyond the context, a repeated long prompt."""
        p, target = self.protocol, self.checker.t
        if target.context_length is not None:
            self.record(self.checker.oversize(target.context_length))
        else:
            self.report.outcome(
                "oversize_prompt", p
            ).skip_reason = "the context length is unknown: pass --context-length"
        if target.prefix_cache == "off":
            self.report.outcome("prefix_cache", p).skip_reason = "--prefix-cache off"
            return
        self.record(self.checker.cache(target.context_length))
        if not self.report.outcome("prefix_cache", p).checked:
            self.report.outcome(
                "prefix_cache", p
            ).skip_reason = (
                "the server reports no cached tokens (pass --prefix-cache on if it caches)"
            )


def run(target: Target, plan: Plan) -> Report:
    notes = discover(target)
    model = target.model
    if model is None:  # discover names it or raises
        raise ValueError("no model to request: pass --model")
    notes.append(probe_thinking(target, model, plan.protocols[0]))
    seed = plan.seed if plan.seed is not None else secrets.randbelow(2**32)
    report = Report(list(plan.protocols), PROPERTIES, seed=seed, notes=notes)
    oracle = Oracle(model, target.tokenizer, target.template, target.default_thinking)
    if target.tokenizer is None:
        for p in plan.protocols:
            report.outcome("prompt_tokens", p).skip_reason = "no --tokenizer given"
    try:
        import jsonschema  # noqa: F401  (only whether it is there)
    except ImportError:
        for p in plan.protocols:
            report.outcome("response_format", p).skip_reason = "jsonschema is not installed"
    gate = Gate()
    claimed: set[tuple[str, str]] = set()
    runs = [
        _Part(target, p, part, oracle, plan, report, gate, claimed)
        for p in plan.protocols
        for part in range(plan.concurrency)
    ]
    with ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(lambda r: r.run(seed), runs))
    for r, (count, seconds, load_dependent) in zip(runs, results, strict=True):
        p = r.protocol
        report.examples[p] = report.examples.get(p, 0) + count
        report.seconds[p] = max(report.seconds.get(p, 0.0), seconds)
        if load_dependent:
            report.notes.append(
                f"{p}: {load_dependent} streamed / non-streamed pair(s) differed next to the "
                "run's other requests and agreed when sent alone: the server's output depends "
                "on what it batches"
            )
    return report
