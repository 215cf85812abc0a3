"""Parts of `deepring conformance` that need no server: the strict SSE reader (against streams
written out by hand per the SSE format) and the JUnit report (read back with ElementTree).
The whole tool runs against a server in tests/e2e/test_conformance_cli.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from deepring.conformance.report import Report
from deepring.conformance.wire import parse_sse

CLEAN = (
    b'event: message_start\r\ndata: {"type": "message_start"}\r\n\r\n'
    b": keep-alive comment\n\n"
    b'data: {"a":\n'
    b"data: 1}\n\n"  # two data lines join with a newline: still JSON
    b"data: [DONE]\n\n"
)


def test_a_clean_stream_has_no_framing_problems():
    events, problems = parse_sse(CLEAN)
    assert problems == []
    assert [(e.name, e.json) for e in events] == [
        ("message_start", {"type": "message_start"}),
        (None, {"a": 1}),
        (None, None),
    ]
    assert events[-1].data == "[DONE]"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"data: {}\n\ndata: {}\n", "ends inside an event"),
        (b"data: {not json}\n\n", "not JSON"),
        (b"daat: {}\n\n", "unknown SSE field"),
        (b"just text\n\n", "no SSE field"),
        (b"event: a\nevent: b\ndata: {}\n\n", "two event names"),
        (b"event: a\n\n", "without data"),
        (b"data: \xff\n\n", "not UTF-8"),
    ],
)
def test_each_framing_problem_is_named(raw, problem):
    _, problems = parse_sse(raw)
    assert any(problem in p for p in problems), problems


def test_the_junit_file_counts_failures_and_skips():
    report = Report(["chat", "messages"], [("a", "first"), ("b", "second")], seed=1)
    report.outcome("a", "chat").checked = 3
    report.outcome("a", "chat").record_failure("total 5 != 2 + 2", {"model": "m"})
    report.outcome("b", "chat").checked = 2
    report.outcome("a", "messages").checked = 1
    report.outcome("b", "messages").skip_reason = "no --tokenizer given"
    suite = ET.fromstring(report.junit())
    assert suite.get("tests") == "4"
    assert suite.get("failures") == "1"
    assert suite.get("skipped") == "1"
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [("chat", "a")]
    assert '{"model": "m"}' in failed[0].find("failure").text
    assert "FAIL a [chat] (1 of 3 examples): total 5 != 2 + 2" in report.text()
    assert report.failed


def test_a_smaller_failure_replaces_a_larger_one():
    report = Report(["chat"], [("a", "first")])
    o = report.outcome("a", "chat")
    o.record_failure("big", {"messages": ["x" * 50]})
    o.record_failure("small", {"messages": []})
    o.record_failure("bigger again", {"messages": ["y" * 80]})
    assert (o.failed, o.message, o.request) == (3, "small", {"messages": []})
