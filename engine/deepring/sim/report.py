"""What a simulation measured: latency percentiles, SLO attainment, utilisation, imbalance.

Everything is measured over the arrival window (first to last session start), so the ramp-up
and the drain at the end do not count: requests that arrived in it, steps that started in it.

- TTFT: first token at the frontend minus the request's arrival there.
- TBT: every gap between two tokens of a request at the frontend (the first decode token's gap
  includes the handoff and the wait for admission, as a client sees it).
- SLO attainment: the share of requests whose TTFT is within the TTFT SLO and whose mean TBT
  (first to last token, over the tokens) is within the TBT SLO; one that failed misses, one
  still running at the end is judged on the tokens it produced.
- steps under the target: the share of decode-carrying steps no longer than the TBT target.
- utilisation: busy time / window length, per worker; its imbalance: max / mean over the
  workers of a role. Decode imbalance is measured at instants (every 0.25 s): max / mean over
  the decode workers of the predicted step time of the batch each holds (what its requests
  wait between tokens) and of the KV blocks each holds, averaged over the instants; and over
  the window, of each worker's token-weighted mean step time.
"""

from __future__ import annotations

import numpy as np

from deepring.sim.cluster import Cluster


def _pct(xs, q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def _weighted_pct(values, weights, q: float) -> float:
    if not len(values):
        return float("nan")
    v, w = np.asarray(values), np.asarray(weights, dtype=float)
    order = np.argsort(v)
    cum = np.cumsum(w[order])
    return float(v[order][min(len(v) - 1, int(np.searchsorted(cum, q / 100 * cum[-1])))])


def _imbalance(values: list[float]) -> float:
    mean = float(np.mean(values)) if values else 0.0
    return float(np.max(values)) / mean if mean > 0 else float("nan")


def summarize(
    cluster: Cluster, slo_ttft_s: float, slo_tbt_s: float, tbt_target_s: float | None = None
) -> dict:
    lo, hi = cluster.window
    span = max(hi - lo, 1e-9)
    mine = [st for st in cluster.finished if lo <= st.arrival <= hi]
    running = [st for st in cluster.requests.values() if lo <= st.arrival <= hi]
    # A request still running at the end is judged on what it produced; one without a first
    # token counts the time it waited as its TTFT (a lower bound) and misses its SLO.
    started = [st for st in (*mine, *running) if st.error is None and st.first_at is not None]
    ttft = [st.first_at - st.arrival for st in started]
    ttft += [cluster.end - st.arrival for st in running if st.first_at is None]
    met = 0
    for st in started:
        tbt = (st.last_at - st.first_at) / (st.received - 1) if st.received > 1 else 0.0
        met += st.first_at - st.arrival <= slo_ttft_s and tbt <= slo_tbt_s
    total = len(mine) + len(running)
    gaps, counts = cluster.tbt_gaps()
    out = {
        "requests": total,
        "failed": sum(st.error is not None for st in mine),
        "unfinished": len(running),
        "ttft_p50_ms": _pct(ttft, 50) * 1e3,
        "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "tbt_p50_ms": _weighted_pct(gaps, counts, 50) * 1e3,
        "tbt_p99_ms": _weighted_pct(gaps, counts, 99) * 1e3,
        "slo_attainment": met / total if total else float("nan"),
    }
    roles: dict[str, list] = {"prefill": [], "decode": []}
    for w in cluster.workers.values():
        roles[w.role_name].append(w)
    decode_steps = np.array(
        [
            (secs, toks, mixed)
            for w in roles["decode"]
            for _, secs, toks, _, mixed in w.steps
            if toks
        ],
        dtype=float,
    ).reshape(-1, 3)
    if tbt_target_s is not None and len(decode_steps):
        out["steps_under_target"] = float(np.mean(decode_steps[:, 0] <= tbt_target_s))
    out["mixed_steps"] = int(decode_steps[:, 2].sum()) if len(decode_steps) else 0
    for role, ws in roles.items():
        util = [w.busy_s / span for w in ws]
        out[f"{role}_util_mean"] = float(np.mean(util))
        out[f"{role}_util_imbalance"] = _imbalance(util)
    step_time, kv = [], []
    for w in roles["decode"]:
        rows = np.array([(secs, toks, used) for _, secs, toks, used, _ in w.steps], dtype=float)
        rows = rows.reshape(-1, 3)
        if rows[:, 1].sum() > 0:
            step_time.append(float((rows[:, 0] * rows[:, 1]).sum() / rows[:, 1].sum()))
        else:
            step_time.append(0.0)
        kv.append(float((rows[:, 0] * rows[:, 2]).sum() / span))
    out["decode_tbt_imbalance"] = _imbalance(step_time)
    out["decode_kv_total_imbalance"] = _imbalance(kv)
    # At each sampled instant: max / mean over the decode workers of the predicted step time
    # of their batch and of their KV blocks in use; averaged over the instants (idle instants
    # skipped).
    steps = [_imbalance(s) for s, _, _ in cluster.samples if sum(s) > 0]
    kvs = [_imbalance(b) for _, b, _ in cluster.samples if sum(b) > 0]
    decoders = max(1, len(roles["decode"]))
    out["decode_batch_mean"] = (
        float(np.mean([n for _, _, n in cluster.samples])) / decoders if cluster.samples else 0.0
    )
    out["decode_step_imbalance"] = float(np.mean(steps)) if steps else float("nan")
    out["decode_kv_imbalance"] = float(np.mean(kvs)) if kvs else float("nan")
    return out


# (key, heading, format); every cell is 8 wide.
_COLUMNS = [
    ("router", "router", "{:>8}"), ("requests", "reqs", "{:>8}"), ("failed", "failed", "{:>8}"),
    ("ttft_p50_ms", "ttft p50", "{:>8.0f}"), ("ttft_p99_ms", "ttft p99", "{:>8.0f}"),
    ("tbt_p50_ms", "tbt p50", "{:>8.1f}"), ("tbt_p99_ms", "tbt p99", "{:>8.1f}"),
    ("slo_attainment", "SLO", "{:>8.3f}"), ("prefill_util_mean", "P util", "{:>8.2f}"),
    ("prefill_util_imbalance", "P imb", "{:>8.3f}"), ("decode_util_mean", "D util", "{:>8.2f}"),
    ("decode_batch_mean", "D batch", "{:>8.1f}"), ("decode_step_imbalance", "D step", "{:>8.3f}"),
    ("decode_kv_imbalance", "D kv", "{:>8.3f}"),
]  # fmt: skip


def table(rows: list[dict]) -> str:
    """Latencies in ms; P/D util: mean utilisation; imb, step, kv: max/mean over workers."""
    head = " ".join(f"{h:>8}" for _, h, _ in _COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(" ".join(fmt.format(r[k]) if k in r else " " * 8 for k, _, fmt in _COLUMNS))
    return "\n".join(lines)
