"""Request traces for the simulator: conversations arriving at random, heavy-tailed lengths.

A trace is a list of sessions (conversations). Sessions start as a Poisson process; each has
one or more turns. Turn 1's prompt is the session's first prompt; turn k's prompt is turn k-1's
prompt, its answer and the new user message, so every later turn finds its history in the
prefix cache (when the earlier turn finished and its blocks were written). A turn is sent
`think_s` after the previous one finished (the simulator closes that loop: a slow answer
delays the next question, as with a real user).

A session may start with its application's system prompt (`apps`, `system_tokens`): the same
tokens for every session of that application, served by the prefix cache after the first.

Lengths have heavy tails, as production traffic does (most prompts short, a few very long:
pasted documents, agent transcripts): a lognormal body and, with probability `tail_p`, a Pareto
tail from `tail_min` with exponent `tail_alpha`, capped at `max_prompt`. Outputs are lognormal,
capped at `max_output`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    new_tokens: int  # the user message's tokens (the whole prompt for the first turn)
    output_tokens: int  # max_tokens of the answer (the simulator ends it there)
    think_s: float  # the user's pause after the previous turn's answer (0 for the first)


@dataclass(frozen=True)
class Session:
    sid: int
    start: float  # arrival of the first turn, seconds from the trace's start
    turns: tuple[Turn, ...]
    app: int = 0  # whose system prompt it starts with (the same tokens for every session)
    system_tokens: int = 0  # that system prompt's length (0: none)


@dataclass(frozen=True)
class TraceConfig:
    sessions: int = 1000
    rate: float = 10.0  # sessions per second
    prompt_median: int = 1000
    prompt_sigma: float = 1.0
    tail_p: float = 0.08
    tail_min: int = 4000
    tail_alpha: float = 1.1
    max_prompt: int = 32768
    followup_median: int = 150
    output_median: int = 200
    output_sigma: float = 0.9
    max_output: int = 2048
    mean_turns: float = 2.0
    max_turns: int = 8
    think_mean_s: float = 5.0
    max_context: int = 65536  # a session stops before its prompt + answer would pass this
    # Applications: every session starts with its application's system prompt (instructions,
    # tool definitions), the same tokens for all its sessions, so the prefix cache serves it
    # after the first; it makes contexts long and prefill cheap, as agent traffic is.
    apps: int = 1
    system_tokens: int = 0  # the median system prompt (lognormal over the applications)

    def __post_init__(self) -> None:
        if self.sessions < 1 or not self.rate > 0:
            raise ValueError("a trace needs sessions >= 1 and a rate > 0")
        if not (1 <= self.prompt_median <= self.max_prompt and self.max_output >= 1):
            raise ValueError("prompt and output lengths must be >= 1 and within their caps")
        if not (self.mean_turns >= 1 and self.max_turns >= 1 and 0 <= self.tail_p <= 1):
            raise ValueError("mean_turns and max_turns must be >= 1, tail_p in [0, 1]")
        if self.max_context < self.max_prompt + self.max_output:
            raise ValueError("max_context must hold the longest prompt and answer")


# Trace shapes for the two step-time presets: the tiny CPU model is ~1000x slower per token.
SHAPES = {
    # Decode-heavy, as a 1:4 prefill:decode deployment is sized for: answers several times
    # longer than the new part of the prompt, conversations whose history the prefix cache
    # serves; short sessions (two turns on average), so a simulation reaches its steady state
    # within a minute or two of simulated time.
    "h800": TraceConfig(
        prompt_median=100,
        tail_p=0.02,
        tail_alpha=1.2,
        followup_median=50,
        output_median=400,
        output_sigma=1.0,
        max_output=4096,
        mean_turns=2.0,
        think_mean_s=2.0,
        apps=16,
        system_tokens=3000,
    ),
    "tiny-cpu": TraceConfig(
        prompt_median=120,
        tail_min=500,
        max_prompt=1500,
        followup_median=30,
        output_median=24,
        max_output=64,
        think_mean_s=1.0,
        max_context=4096,
    ),
}


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def prompt_length(rng: random.Random, c: TraceConfig) -> int:
    if rng.random() < c.tail_p:
        n = c.tail_min * (1.0 - rng.random()) ** (-1.0 / c.tail_alpha)  # Pareto
    else:
        n = _lognormal(rng, c.prompt_median, c.prompt_sigma)
    return max(1, min(c.max_prompt, int(n)))


def generate(c: TraceConfig, seed: int = 0) -> list[Session]:
    """A trace of c.sessions sessions (the same for the same config and seed)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for sid in range(c.sessions):
        t += rng.expovariate(c.rate)
        n_turns = 1
        while n_turns < c.max_turns and rng.random() > 1.0 / c.mean_turns:
            n_turns += 1
        app = rng.randrange(c.apps)
        system = _system_tokens(c, app)
        turns, context = [], system
        for k in range(n_turns):
            new = (
                prompt_length(rng, c)
                if k == 0
                else max(1, int(_lognormal(rng, c.followup_median, 1.0)))
            )
            out_n = max(1, min(c.max_output, int(_lognormal(rng, c.output_median, c.output_sigma))))
            if context + new + out_n > c.max_context:
                break
            think = rng.expovariate(1.0 / c.think_mean_s) if k else 0.0
            turns.append(Turn(new, out_n, think))
            context += new + out_n
        out.append(Session(sid, t, tuple(turns), app, system))
    return out


def _system_tokens(c: TraceConfig, app: int) -> int:
    if not c.system_tokens:
        return 0
    n = _lognormal(random.Random(app * 7919 + 1), c.system_tokens, 0.5)
    return min(int(n), c.max_context // 4)


def stats(sessions: list[Session]) -> dict:
    """Lengths of a trace, for the report."""
    firsts = sorted(s.turns[0].new_tokens for s in sessions)
    outs = sorted(t.output_tokens for s in sessions for t in s.turns)
    n = len(firsts)
    return {
        "sessions": n,
        "turns": len(outs),
        "first_prompt_p50": firsts[n // 2],
        "first_prompt_p99": firsts[min(n - 1, int(0.99 * n))],
        "first_prompt_max": firsts[-1],
        "output_p50": outs[len(outs) // 2],
        "output_p99": outs[min(len(outs) - 1, int(0.99 * len(outs)))],
        "duration_s": sessions[-1].start if sessions else 0.0,
    }
