"""`DEEPRING_GREEDY_HEAD=auto`: the greedy head measured fastest on the weight per batch size
(kernels.greedy_choice, greedy_choice_cache), with scripted timings for the choice itself and
the real heads for exactness (whatever is chosen, the token is the fp32 argmax)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from deepring.kernels import greedy_choice_cache
from deepring.kernels.greedy_choice import GIVE_UP, HeadChoice, measure
from deepring.kernels.greedy_head import GreedyArgmax


class Scripted:
    """Heads whose calls take scripted seconds on a fake clock: costs[name][rows]."""

    def __init__(self, costs: dict[str, dict[int, float]]) -> None:
        self.now, self.costs, self.calls = 0.0, costs, []

    def clock(self) -> float:
        return self.now

    def heads(self):
        def head(name):
            def run(y):
                self.calls.append((name, y.shape[0]))
                self.now += self.costs[name][y.shape[0]]

            return run

        return {name: head(name) for name in self.costs}


def test_the_fastest_head_per_row_count_is_chosen():
    s = Scripted({"fp32": {1: 0.010, 32: 0.050}, "bf16": {1: 0.004, 32: 0.170},
                  "int8": {1: 0.006, 32: 0.030}})  # fmt: skip
    choice = measure(s.heads(), 8, clock=s.clock)
    assert choice.by_rows == {1: "bf16", 32: "int8"}
    assert [choice.kind(r) for r in (1, 2, 32, 500)] == ["bf16", "int8", "int8", "int8"]
    assert choice.seconds["bf16"] == pytest.approx({1: 0.004, 32: 0.170})


def test_a_pathological_head_is_dropped_before_the_large_batch():
    """int8 at 50x fp32 for one row: two calls (one untimed, one timed) and never at 32 rows,
    where its call would take seconds."""
    s = Scripted({"fp32": {1: 0.010, 32: 0.050}, "int8": {1: 0.5, 32: 20.0}})
    choice = measure(s.heads(), 8, clock=s.clock)
    assert choice.by_rows == {1: "fp32", 32: "fp32"}
    assert choice.seconds["int8"] == {1: None, 32: None}
    assert s.calls.count(("int8", 1)) == 2
    assert ("int8", 32) not in s.calls
    assert GIVE_UP * 0.010 < 0.5  # (the script is past the give-up ratio)


def test_ties_keep_fp32_and_fp32_is_required():
    s = Scripted({"fp32": {1: 0.01, 32: 0.05}, "bf16": {1: 0.01, 32: 0.05}})
    assert measure(s.heads(), 8, clock=s.clock).by_rows == {1: "fp32", 32: "fp32"}
    with pytest.raises(ValueError, match="fp32"):
        measure({"bf16": lambda y: None}, 8)


def test_the_choice_is_kept_on_disk_and_a_damaged_file_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPRING_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(greedy_choice_cache, "_MEMO", {})
    runs = []

    def run(by_rows):
        def go():
            runs.append(by_rows)
            return HeadChoice(by_rows, {"fp32": {1: 0.1, 32: 0.2}, "bf16": {1: 0.05, 32: None}})

        return go

    first = greedy_choice_cache.cached_choice(
        (10, 4), ("fp32", "bf16"), run({1: "bf16", 32: "fp32"})
    )
    monkeypatch.setattr(greedy_choice_cache, "_MEMO", {})  # a new process
    again = greedy_choice_cache.cached_choice(
        (10, 4), ("fp32", "bf16"), run({1: "fp32", 32: "fp32"})
    )
    assert again == first
    assert len(runs) == 1
    (path,) = (tmp_path / "greedy-head").glob("*.json")
    for damaged in (
        "{not json",
        json.dumps({"by_rows": {"1": "int8", "32": "fp32"}, "seconds": {}}),
    ):
        path.write_text(damaged)  # unreadable, or naming a head that is not a candidate
        monkeypatch.setattr(greedy_choice_cache, "_MEMO", {})
        got = greedy_choice_cache.cached_choice(
            (10, 4), ("fp32", "bf16"), run({1: "fp32", 32: "fp32"})
        )
        assert got.by_rows == {1: "fp32", 32: "fp32"}
    assert len(runs) == 3
    # Another shape is another measurement.
    greedy_choice_cache.cached_choice((11, 4), ("fp32", "bf16"), run({1: "fp32", 32: "fp32"}))
    assert len(runs) == 4


@pytest.mark.parametrize("by_rows", [{1: "bf16", 32: "fp32"}, {1: "fp32", 32: "bf16"}])
def test_auto_runs_the_chosen_head_per_step_and_gives_the_fp32_argmax(monkeypatch, by_rows):
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "auto")
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3000, 32, generator=g)
    head = GreedyArgmax()
    head.choice = HeadChoice(by_rows, {})  # (what a measurement on some machine chose)
    head.prepare(w)
    for rows in (1, 5, 40):
        y = torch.randn(rows, 32, generator=g)
        assert torch.equal(head(y, w), F.linear(y, w).argmax(-1))
        want = by_rows[1 if rows == 1 else 32]
        assert (head._used.kind if head._used is not None else "fp32") == want


def test_auto_measures_real_heads_once_per_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "auto")
    monkeypatch.setenv("DEEPRING_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(greedy_choice_cache, "_MEMO", {})
    w = torch.randn(4000, 32, generator=torch.Generator().manual_seed(4))
    head = GreedyArgmax()
    head.prepare(w)
    kinds = set(head.choice.by_rows.values())
    assert kinds <= {"fp32", "bf16", "int8"}
    assert all(head.choice.seconds["fp32"][r] > 0 for r in (1, 32))
    other = GreedyArgmax()
    other.prepare(w)
    assert other.choice is head.choice  # remembered, not measured again
