"""What a run found, per property and protocol: the summary table, the failures with their
smallest failing request, and a JUnit XML file for CI."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "FAIL", "skipped"


@dataclass
class Outcome:
    """One property on one protocol, over a whole run."""

    checked: int = 0  # examples the property applied to
    failed: int = 0
    message: str = ""  # what was wrong in the smallest failing example
    request: Any = None  # that example's request body
    request_size: int = -1  # its size (JSON characters): a smaller failure replaces it
    skip_reason: str = ""

    @property
    def status(self) -> str:
        if self.failed:
            return FAIL
        return PASS if self.checked else SKIP

    def record_failure(self, message: str, request: Any) -> None:
        self.failed += 1
        self.consider(message, request)

    def consider(self, message: str, request: Any) -> None:
        """Keep the smallest failing request seen (shrinking finds smaller ones; the last of
        equal size is the most shrunk)."""
        size = len(request_text(request))
        if self.request_size < 0 or size <= self.request_size:
            self.message, self.request, self.request_size = message, request, size


@dataclass
class Report:
    protocols: list[str]
    properties: list[tuple[str, str]]  # (name, what it checks), in table order
    outcomes: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)  # per protocol
    seconds: dict[str, float] = field(default_factory=dict)  # per protocol
    seed: int | None = None
    notes: list[str] = field(default_factory=list)  # what the run learnt about the server

    def outcome(self, prop: str, protocol: str) -> Outcome:
        return self.outcomes.setdefault((prop, protocol), Outcome())

    @property
    def failed(self) -> bool:
        return any(o.failed for o in self.outcomes.values())

    def table(self) -> str:
        head = ["property", *self.protocols]
        rows = [head]
        for name, _ in self.properties:
            cells = [name]
            for p in self.protocols:
                o = self.outcome(name, p)
                cells.append(f"{o.status} ({o.checked})" if o.status != SKIP else SKIP)
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(line.rstrip() for line in lines)

    def text(self) -> str:
        runs = ", ".join(
            f"{p}: {self.examples.get(p, 0)} examples in {self.seconds.get(p, 0):.1f}s"
            for p in self.protocols
        )
        out = [f"deepring conformance (seed {self.seed}; {runs})", "", self.table()]
        skipped = [
            (k, o.skip_reason)
            for k, o in self.outcomes.items()
            if o.status == SKIP and o.skip_reason
        ]
        if skipped:
            out += ["", "skipped:"]
            out += [f"  {prop} [{proto}]: {why}" for (prop, proto), why in sorted(skipped)]
        if self.notes:
            out += ["", *self.notes]
        failures = [(k, o) for k, o in self.outcomes.items() if o.failed]
        for (prop, proto), o in sorted(failures):
            out += [
                "",
                f"FAIL {prop} [{proto}] ({o.failed} of {o.checked} examples): {o.message}",
                f"  smallest failing request: {request_text(o.request)}",
            ]
        verdict = "FAILED" if failures else "passed"
        out += ["", f"conformance {verdict}: {len(failures)} failing property x protocol"]
        return "\n".join(out)

    def junit(self) -> bytes:
        """One test case per property x protocol (class name: the protocol)."""
        suite = ET.Element("testsuite", name="deepring-conformance")
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for p in self.protocols:
            for name, what in self.properties:
                o = self.outcome(name, p)
                case = ET.SubElement(
                    suite, "testcase", classname=p, name=name, time=f"{self.seconds.get(p, 0):.3f}"
                )
                counts["tests"] += 1
                if o.status == FAIL:
                    counts["failures"] += 1
                    f = ET.SubElement(case, "failure", message=o.message[:500])
                    f.text = f"{what}\n{o.message}\nsmallest failing request: " + request_text(
                        o.request
                    )
                elif o.status == SKIP:
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=o.skip_reason or "never applied")
        for key, value in counts.items():
            suite.set(key, str(value))
        return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def request_text(body: Any) -> str:
    """A request body as it went on the wire (JSON text; str / bytes bodies as they are)."""
    if isinstance(body, bytes):
        return body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        return body
    return json.dumps(body, ensure_ascii=False)
