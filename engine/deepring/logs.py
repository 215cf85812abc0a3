"""Logging of every serving process: one line per record on stderr, tagged with the process
(frontend, prefill-0, ...), at DEEPRING_LOG_LEVEL."""

from __future__ import annotations

import logging
import sys

from deepring import env


def setup_logging(name: str) -> None:
    logging.basicConfig(
        level=env.log_level(),
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
