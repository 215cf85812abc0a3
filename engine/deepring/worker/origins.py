"""Which frontend each of a worker's requests came from.

A worker may serve several frontends (`--frontend A --frontend B`), which number their requests
independently: two of them can use the same id. So the engine knows every request by a
worker-local id, and this map turns it back into (link, the frontend's id), link being the
index of the frontend's socket in the worker's list. Everything a request produces goes back
over its own link, and a frontend's Abort or its loss touches only its own requests.
"""

from __future__ import annotations

import itertools


class Origins:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._origin: dict[int, tuple[int, int]] = {}
        self._local: dict[tuple[int, int], int] = {}

    def add(self, link: int, rid: int) -> int | None:
        """A local id for request `rid` of frontend `link`; None when that frontend already has
        a request with this id here (a duplicate the caller refuses)."""
        key = (link, rid)
        if key in self._local:
            return None
        local = next(self._ids)
        self._local[key] = local
        self._origin[local] = key
        return local

    def get(self, local: int) -> tuple[int, int] | None:
        return self._origin.get(local)

    def local(self, link: int, rid: int) -> int | None:
        return self._local.get((link, rid))

    def pop(self, local: int) -> tuple[int, int] | None:
        key = self._origin.pop(local, None)
        if key is not None:
            del self._local[key]
        return key

    def of_link(self, link: int | None) -> list[int]:
        """The local ids of one frontend's requests (of all frontends' with None)."""
        return [loc for loc, (lk, _) in self._origin.items() if link is None or lk == link]

    def __len__(self) -> int:
        return len(self._origin)
