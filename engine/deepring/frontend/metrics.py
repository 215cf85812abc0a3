"""Prometheus metrics of the frontend (text exposition format 0.0.4), without a client library.

Frontend-side: request counts by outcome, TTFT and TPOT histograms, prompt and generated token
counters, generated tokens/s over a sliding window, queued requests, requests refused for their
API key or a rate limit, HTTP requests and connections refused by the server's limits (by
reason), ring messages dropped (by reason) and ring connections refused by CURVE.
Worker-side gauges (queue length, running requests, KV blocks in use) and the workers' own
dropped ring messages come from the workers' Stats reports.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        if list(buckets) != sorted(buckets):
            raise ValueError("histogram buckets must be increasing")
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        for b, c in zip(self.buckets, self.counts, strict=False):
            cum += c
            out.append(f'{self.name}_bucket{{le="{b}"}} {cum}')
        out.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{self.name}_sum {self.sum}")
        out.append(f"{self.name}_count {self.count}")
        return out


class Rate:
    """Events per second over the last `window` seconds."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, n: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._events.append((now, n))
        self._total += n
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window:
            self._total -= self._events.popleft()[1]

    def value(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._trim(now)
        return self._total / self.window


class Metrics:
    def __init__(self) -> None:
        self.ttft = Histogram(
            "deepring_time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.tpot = Histogram(
            "deepring_time_per_output_token_seconds",
            "Time per output token after the first, per request.",
            TPOT_BUCKETS,
        )
        self.requests: dict[str, int] = {}
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0  # served from the prefix cache
        self.prompt_images = 0  # images in submitted prompts (their spans count as tokens)
        self.rerouted = 0  # requests resubmitted after their worker was lost
        self.generated_tokens = 0
        self.rate = Rate()
        self.auth_failures = 0  # requests refused for a missing or wrong API key
        self.rate_limited: dict[str, int] = {}  # 429s of the per-key limits: requests, tokens
        self.ring_dropped: dict[str, int] = {}  # the frontend's ipc.drops counters, by reason
        # CURVE handshakes the frontend's ZAP handler refused (set by the ring client).
        self.ring_auth_denied: Callable[[], int] = lambda: 0
        # HTTP connections the server's limits refused or dropped, by reason (set by the
        # server: frontend.http's HttpServer.refused).
        self.http_refused: Callable[[], dict[str, int]] = dict

    def request_done(self, outcome: str) -> None:
        self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def tokens(self, n: int, now: float) -> None:
        self.generated_tokens += n
        self.rate.add(n, now)

    def render(
        self,
        frontend: dict[str, float],
        workers: Iterable[dict],
        capacity: dict | None = None,
        local: dict | None = None,
    ) -> str:
        """capacity: per role, workers expected and ready; local: the supervisor's report of
        the host's worker processes (restarts, crash loops)."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        metric(
            "deepring_requests_total",
            "counter",
            "Finished requests by outcome.",
            [(f'{{outcome="{k}"}}', v) for k, v in sorted(self.requests.items())],
        )
        metric(
            "deepring_prompt_tokens_total",
            "counter",
            "Prompt tokens submitted.",
            [("", self.prompt_tokens)],
        )
        metric(
            "deepring_prompt_images_total",
            "counter",
            "Images in submitted prompts (each laid out as its span of prompt tokens).",
            [("", self.prompt_images)],
        )
        metric(
            "deepring_requests_rerouted_total",
            "counter",
            "Requests resubmitted to other workers after theirs was lost.",
            [("", self.rerouted)],
        )
        metric(
            "deepring_prompt_cached_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            [("", self.cached_prompt_tokens)],
        )
        metric(
            "deepring_generation_tokens_total",
            "counter",
            "Tokens generated.",
            [("", self.generated_tokens)],
        )
        metric(
            "deepring_generation_tokens_per_second",
            "gauge",
            f"Generated tokens per second over the last {self.rate.window:.0f}s.",
            [("", round(self.rate.value(), 3))],
        )
        metric(
            "deepring_http_auth_failures_total",
            "counter",
            "Requests refused with 401: a missing or unknown API key.",
            [("", self.auth_failures)],
        )
        metric(
            "deepring_http_rate_limited_total",
            "counter",
            "Requests refused with 429 by a per-key rate limit.",
            [(f'{{limit="{k}"}}', v) for k, v in sorted(self.rate_limited.items())],
        )
        metric(
            "deepring_http_refused_total",
            "counter",
            "HTTP requests and connections refused or dropped by the server's limits, by "
            "reason: connection_limit (503), header_timeout and body_timeout (408), "
            "head_too_large (414, 431), body_too_large (413), malformed (400 and other "
            "unparsable requests), slow_reader (a response the client stopped reading).",
            [(f'{{reason="{k}"}}', v) for k, v in sorted(self.http_refused().items())],
        )
        metric(
            "deepring_ring_dropped_frames_total",
            "counter",
            "Ring messages the frontend dropped, by reason.",
            [(f'{{reason="{k}"}}', v) for k, v in sorted(self.ring_dropped.items())],
        )
        metric(
            "deepring_ring_auth_denied_total",
            "counter",
            "Ring connections refused by CURVE authentication (unknown client key).",
            [("", self.ring_auth_denied())],
        )
        for name, value in frontend.items():
            metric(
                f"deepring_frontend_{name}",
                "gauge",
                f"Frontend {name.replace('_', ' ')}.",
                [("", value)],
            )
        lines.extend(self.ttft.render())
        lines.extend(self.tpot.render())
        workers = list(workers)
        for key, help_text in (
            ("queue_length", "Requests queued in the worker."),
            ("running_requests", "Requests in the worker's running batch."),
            ("kv_blocks_used", "KV cache blocks in use."),
            ("kv_blocks_total", "KV cache blocks in the pool."),
            ("up", "1 when the worker is registered and ready."),
            ("generated_tokens_total", "Tokens the worker sampled since it started."),
            ("steps_total", "Engine steps the worker ran since it started."),
            ("step_seconds_total", "Wall time the worker spent in engine steps."),
            ("compute_seconds_total", "Of that, time in the model runner (forward, sampling)."),
            ("busy_seconds_total", "Wall time of the worker's loop iterations that ran a step."),
            ("preemptions_total", "Requests the worker preempted (to be recomputed)."),
            ("backlog_seconds", "Predicted seconds of the prompt work the worker holds."),
        ):
            metric(
                f"deepring_worker_{key}",
                "counter" if key.endswith("_total") else "gauge",
                help_text,
                [(f'{{worker="{w["worker"]}",role="{w["role"]}"}}', w[key]) for w in workers],
            )
        self._prefix_cache(metric, workers)
        self._expert_parallel(metric, workers)
        metric(
            "deepring_worker_ring_dropped_frames_total",
            "counter",
            "Ring messages a worker dropped, by reason.",
            [
                (f'{{worker="{w["worker"]}",role="{w["role"]}",reason="{reason}"}}', n)
                for w in workers
                for reason, n in sorted(w.get("ring_dropped", {}).items())
            ],
        )
        if capacity is not None:
            for key, help_text in (("expected", "Workers of the role the server runs with."),
                                   ("ready", "Workers of the role ready now.")):  # fmt: skip
                metric(
                    f"deepring_workers_{key}",
                    "gauge",
                    help_text,
                    [(f'{{role="{r}"}}', c[key]) for r, c in sorted(capacity.items())],
                )
        if local is not None:
            ws = sorted(local["workers"].items())
            metric(
                "deepring_worker_restarts_total",
                "counter",
                "Restarts of the worker process after an unexpected exit.",
                [(f'{{worker="{w}"}}', r["restarts"]) for w, r in ws],
            )
            metric(
                "deepring_worker_crash_loop",
                "gauge",
                "1 while the worker process keeps exiting (DEEPRING_CRASH_LOOP_*).",
                [(f'{{worker="{w}"}}', 1 if r["crash_loop"] else 0) for w, r in ws],
            )
        return "\n".join(lines) + "\n"

    @staticmethod
    def _expert_parallel(metric, workers: list[dict]) -> None:
        """The ranks of expert-parallel groups (worker.ep_rank): the load-balance factor, max /
        mean tokens per rank over every MoE layer of every step, of the recent steps and since
        the start; the group steps and the rearrangements of the experts."""
        ranks = [(w, w["expert_parallel"]) for w in workers if w.get("expert_parallel")]
        if not ranks:
            return

        def labels(w: dict, ep: dict) -> str:
            return f'{{worker="{w["worker"]}",role="{w["role"]}",group="{ep["group"]}"}}'

        for name, kind, help_text, value in (
            ("balance_factor", "gauge", "Max / mean tokens per rank per MoE layer step, "
             "over the recent steps (1 is perfect balance).", lambda ep: ep["balance_factor"]),
            # (1.0 before the group routed anything)
            ("balance_factor_mean", "gauge", "The same, averaged since the group started.",
             lambda ep: (ep["balance_factor_sum"] or 1.0) / max(1, ep["balance_rows"])),
            ("group_steps_total", "counter", "Steps the expert-parallel group ran together.",
             lambda ep: ep["group_steps"]),
            ("rebalances_total", "counter", "Rearrangements of the experts over the group.",
             lambda ep: ep["rebalances"]),
            ("expert_slots", "gauge", "Routed-expert slots per MoE layer on the rank.",
             lambda ep: ep["slots"]),
        ):  # fmt: skip
            metric(
                f"deepring_ep_{name}",
                kind,
                help_text,
                [(labels(w, ep), round(value(ep), 6)) for w, ep in ranks],
            )

    @staticmethod
    def _prefix_cache(metric, workers: list[dict]) -> None:
        """Each worker's prefix-cache counters (core.prefix report): per tier hits, misses,
        bytes, evictions, expiries, store errors; ring snapshot hits; replayed tokens."""
        keys = sorted({k for w in workers for k in w.get("prefix_cache", {})})
        for key in keys:
            gauge = key in _PREFIX_GAUGES
            metric(
                f"deepring_prefix_cache_{key}" + ("" if gauge else "_total"),
                "gauge" if gauge else "counter",
                f"Prefix cache: {key.replace('_', ' ')}.",
                [
                    (f'{{worker="{w["worker"]}",role="{w["role"]}"}}', w["prefix_cache"][key])
                    for w in workers
                    if key in w.get("prefix_cache", {})
                ],
            )


# Prefix-cache values that go up and down (the others only grow).
_PREFIX_GAUGES = frozenset(
    {"device_blocks", "host_blocks", "host_bytes", "ring_snapshots", "ring_bytes"}
)
