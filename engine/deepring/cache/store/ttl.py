"""How long the persistent tiers keep a prefix: two traffic classes, with DeepSeek's figures
(agent traffic kept 3 days, chatbot traffic 7 days). The engine decides which class a request
belongs to; a hit renews an entry for its class's full TTL (base.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

AGENT_TTL_S = 3 * 86400
CHAT_TTL_S = 7 * 86400


@dataclass(frozen=True)
class TtlPolicy:
    """The TTL, in seconds, of each traffic class."""

    agent_s: float = AGENT_TTL_S
    chat_s: float = CHAT_TTL_S

    def __post_init__(self) -> None:
        for name in ("agent_s", "chat_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"TtlPolicy.{name} is a number of seconds, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"TtlPolicy.{name} must be a positive number, got {value!r}")
