"""The worker's step timeline (worker.timeline): a Chrome trace that is valid JSON once closed
and readable while written, nested spans, a bounded size, nothing at all when off."""

from __future__ import annotations

import json

from deepring.worker.timeline import Timeline


class _Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_spans_and_a_step_make_a_chrome_trace(tmp_path):
    clock = _Clock()
    path = tmp_path / "t" / "decode-0.trace.json"
    tl = Timeline(path, "decode-0", clock=clock)
    with tl.span("step"):
        clock.now += 0.001
        tl.step((10.001, 10.002, 10.010, 10.011), {"tokens": 4, "seqs": 4})
        clock.now = 10.012
    tl.close()
    events = json.loads(path.read_text())

    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    assert (spans["step"]["ts"], spans["step"]["dur"]) == (0.0, 12000.0)
    assert (spans["schedule"]["ts"], spans["schedule"]["dur"]) == (1000.0, 1000.0)
    assert (spans["compute"]["dur"], spans["compute"]["args"]) == (8000.0, {"tokens": 4, "seqs": 4})
    assert spans["post"]["ts"] == 10000.0
    names = [e["args"]["name"] for e in events if e["ph"] == "M"]
    assert names == ["decode-0", "loop"]
    assert events[-1]["name"] == "end"


def test_a_live_trace_reads_as_json_once_flushed(tmp_path):
    clock = _Clock()
    path = tmp_path / "p.json"
    tl = Timeline(path, "prefill-0", clock=clock)
    tl.add("poll", 10.0, 10.1)
    clock.now += 1.0  # past FLUSH_S: the next event flushes
    tl.add("poll", 11.0, 11.1)
    events = json.loads(path.read_text().rstrip().rstrip(",") + "]")
    assert [e["name"] for e in events if e["ph"] == "X"] == ["poll", "poll"]
    tl.close()


def test_the_trace_stops_at_its_bound_and_off_writes_nothing(tmp_path):
    path = tmp_path / "b.json"
    tl = Timeline(path, "w", max_events=10)
    for i in range(100):
        tl.add("x", i, i + 1)
    assert not tl.on  # closed at the bound
    events = json.loads(path.read_text())
    assert len(events) == 11  # the bound, then the closing event
    off = Timeline(None, "w")
    with off.span("step"):
        off.add("x", 0, 1)
    off.step((0, 1, 2, 3), {})
    off.close()
    assert not off.on
    assert list(tmp_path.iterdir()) == [path]
