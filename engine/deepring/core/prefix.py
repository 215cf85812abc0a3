"""The prefix KV cache of one engine: which cached prefix a request starts from, and what it
leaves behind for the next one.

Tiers, fastest first (each keyed by the hash chain of cache.prefix):
- device: published blocks in the paged pool (cache.allocator), kept unreferenced in LRU order
  until an allocation needs the room;
- host: a bytes-bounded LRU of block records (write-through: a block is copied here when it is
  published, so an eviction from the device loses nothing);
- store: the persistent tier (cache.store: a directory, possibly on a shared mount, or Redis),
  written behind by a writer thread and read ahead by a reader thread when a request arrives, so
  a step never waits on storage.

A block holds everything needed to continue from its end except the sliding-window ring (see
cache.pool: paged entries, indexer keys, CSA edges). The ring (SWA state) is snapshotted at two
points of each request, the last block boundary of its prompt and of its output, into a separate
host pool with a short TTL (and the store, with that TTL). On a hit the request continues:
- with the ring snapshot, exactly from the hit;
- without it, by replaying: `exact` recomputes the last layers x (window - 1) tokens of the
  cached prefix, the receptive field of the ring, so the result equals a cold run; `bounded`
  recomputes only the last `window` tokens (V4.1's SWA bounded replay: approximate on V4). A
  replay starts a fresh window at its first token and never rewrites the cached blocks
  (SeqChunk.window_floor / compress_from).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from deepring.cache.allocator import BlockAllocator
from deepring.cache.pool import KVCachePool
from deepring.cache.prefix import HostTier, chain_keys, ring_key, root_key
from deepring.cache.staging import HostCopies
from deepring.cache.transfer import (
    StateError,
    fingerprint,
    import_blocks,
    import_ring,
)
from deepring.config import AGENT_TTL_S, CHAT_TTL_S, SWA_TTL_S
from deepring.core.request import Request

log = logging.getLogger("deepring.cache")

REPLAY_MODES = ("exact", "bounded")
# Store writes waiting for the writer thread beyond this are dropped (and counted): a slow store
# must not grow host memory without bound.
_MAX_PENDING_WRITES = 4096


class Store(Protocol):
    """What the engine uses of a persistent tier (cache.store.BlockStore)."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...
    def put_many(self, items: list[tuple[bytes, bytes, float]]) -> int: ...
    def delete_many(self, keys: list[bytes]) -> int: ...
    def stats(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class PrefixConfig:
    host_bytes: int = 1 << 30  # host tier of block records
    ring_bytes: int = 256 << 20  # host pool of ring snapshots
    ring_ttl_s: float = SWA_TTL_S
    swa_replay: str = "exact"  # exact | bounded
    chat_ttl_s: float = CHAT_TTL_S  # store TTL of chat traffic
    agent_ttl_s: float = AGENT_TTL_S  # store TTL of agent traffic (tools declared)

    def __post_init__(self) -> None:
        if self.swa_replay not in REPLAY_MODES:
            raise ValueError(f"swa_replay must be one of {REPLAY_MODES}, got {self.swa_replay!r}")
        for name in ("host_bytes", "ring_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("ring_ttl_s", "chat_ttl_s", "agent_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")


_STATS = (
    "requests", "prompt_tokens", "hit_tokens", "hit_blocks_device", "hit_blocks_host",
    "hit_blocks_store", "ring_hits", "ring_misses", "replayed_tokens", "published",
    "bad_records", "snapshots", "store_writes_dropped",
)  # fmt: skip


class PrefixCache:
    def __init__(
        self,
        pool: KVCachePool,
        blocks: BlockAllocator,
        config: PrefixConfig,
        *,
        identity: str,
        num_layers: int,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
        drafter: str = "",
    ) -> None:
        self.pool = pool
        # The speculative drafter whose window rings the snapshots hold ("": none; ring_key).
        self.drafter = drafter
        self.blocks = blocks
        self.config = config
        self.block_size = pool.cache.block_size
        self.window = pool.layout.window
        self.root = root_key(identity, fingerprint(pool))
        # Tokens a ring-less hit recomputes: the ring's receptive field through every layer
        # (layer l's ring at the hit depends on l * (window - 1) tokens more below it), or one
        # window (bounded).
        w = self.window
        self.replay_tokens = num_layers * (w - 1) if config.swa_replay == "exact" else w
        self.host = HostTier(config.host_bytes, clock)
        self.copies = HostCopies(pool)  # device -> host copies (overlapped on CUDA)
        self.rings = HostTier(config.ring_bytes, clock)
        self.store = store
        self.stats = dict.fromkeys(_STATS, 0)
        self._reader = ThreadPoolExecutor(1, "kv-read") if store is not None else None
        self._writer = ThreadPoolExecutor(1, "kv-write") if store is not None else None
        self._writes: list[tuple[bytes, bytes, float]] = []
        self._pending_writes = 0
        self.sweeper = None  # the store's expiry sweeper (cache.store.Sweeper), if one runs
        # V4.1 decoder SWA bounded replay (EngineCore sets it): the decoder computes a prompt's
        # last KEEP tokens from the encoder's outputs, which no tier keeps; 0 = off.
        self.decoder_keep = 0

    # ---- arrival: keys and read-ahead --------------------------------------------------------

    def plan(self, req: Request) -> None:
        """Name the request's prompt blocks and start reading from the store what the faster
        tiers lack."""
        # Over prompt and output: a request resumed after a fault has both.
        req.block_keys = chain_keys(self.root, req.key_tokens(0, req.num_tokens), self.block_size)
        self.stats["requests"] += 1
        if self._reader is None:
            return
        usable = self._usable(req)
        i = 0
        while i < usable and self._local(req.block_keys[i]):
            i += 1
        if i < usable or (usable and self._ring_key(req.block_keys[usable - 1]) not in self.rings):
            req.fetch = self._reader.submit(self._fetch, req.block_keys[:usable], i)

    def _usable(self, req: Request) -> int:
        """Blocks a hit may cover: at least one token must be left to compute the logits."""
        return min(len(req.block_keys), (req.num_tokens - 1) // self.block_size)

    def _local(self, key: bytes) -> bool:
        return self.blocks.lookup(key) is not None or key in self.host

    def _fetch(self, keys: list[bytes], first: int) -> dict[bytes, bytes]:
        """Reader thread: the store's records of keys[first:] (stopping at the first miss) and
        the ring snapshot of the deepest block found."""
        got: dict[bytes, bytes] = {}
        if self.store is None:
            return got
        want = keys[first:]
        for key, rec in zip(want, self.store.get_many(want) if want else [], strict=True):
            if rec is None:
                break
            got[key] = rec
        depth = first + len(got)
        if depth:
            rk = self._ring_key(keys[depth - 1])
            if rk not in self.rings:
                (rec,) = self.store.get_many([rk])
                if rec is not None:
                    got[rk] = rec
        return got

    def wait_reads(self, reqs: list[Request], timeout: float) -> None:
        """Block until one of these requests' store reads is done, or `timeout` seconds."""
        pending = [r.fetch for r in reqs if r.fetch is not None]
        if pending:
            wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)

    def ready(self, req: Request) -> bool:
        """Whether the request's store read-ahead is done (its records are then kept on it)."""
        fut: Future | None = req.fetch
        if fut is None:
            return True
        if not fut.done():
            return False
        req.fetch = None
        try:
            req.fetched = fut.result()
        except Exception as e:  # noqa: BLE001 - a failing store is a miss, never an error
            log.warning("prefix cache: store read failed: %s", e)
            req.fetched = {}
        return True

    def expected_hit(self, req: Request) -> int:
        """Prompt tokens the cache will likely serve a waiting request at admission: its
        leading blocks in the device or host tier or already read from the store (a read in
        flight counts nothing). For the load report (EngineCore.load)."""
        fetched = req.fetched or {}
        n = 0
        for key in req.block_keys[: self._usable(req)]:
            if not (self._local(key) or key in fetched):
                break
            n += 1
        return n * self.block_size

    def _ring_key(self, block_key: bytes) -> bytes:
        return ring_key(block_key, self.drafter)

    # ---- admission -----------------------------------------------------------------------------

    def acquire(self, req: Request, slot: int) -> None:
        """Take the request's longest cached prefix into its blocks and `slot` (ring snapshot or
        compressor edges), and set where its computation starts."""
        self._take(req, slot)
        req.snapshot_at = self.snapshot_point(req)

    def _take(self, req: Request, slot: int) -> None:
        fetched = req.fetched or {}
        req.fetched = None
        self.stats["prompt_tokens"] += len(req.prompt_ids)
        bs = self.block_size
        taken: list[int] = []
        for i in range(self._usable(req)):
            key = req.block_keys[i]
            blk = self.blocks.lookup(key)
            if blk is not None:
                self.blocks.take(blk)
                taken.append(blk)
                self.stats["hit_blocks_device"] += 1
                continue
            rec, tier = self.host.get(key), "host"
            if rec is None:
                rec, tier = fetched.get(key), "store"
            if rec is None or not self.blocks.can_allocate(1):
                break
            (blk,) = self.blocks.allocate(1)
            try:
                import_blocks(self.pool, rec, [blk])
            except StateError as e:
                self._bad(key, e)
                self.blocks.free([blk])
                break
            self.blocks.publish(blk, key)
            if tier == "store":
                self.host.put(key, rec)
            taken.append(blk)
            self.stats[f"hit_blocks_{tier}"] += 1
        req.blocks = taken
        hit = len(taken) * bs
        req.published = req.stored = len(taken)
        req.cache_hit = req.compress_from = hit
        if not hit:
            return
        self.stats["hit_tokens"] += hit
        rk = self._ring_key(req.block_keys[len(taken) - 1])
        ring = self.rings.get(rk) or fetched.get(rk)
        if ring is not None:
            try:
                import_ring(self.pool, ring, slot)
            except StateError as e:
                self._bad(rk, e)
                ring = None
        # The compressor tails come from the edges of the block ending at the hit (the ring
        # snapshot holds only the rings: the tail rows a later entry reads are exactly those).
        self._edges_to_tail(taken[-1], hit, slot)
        lo = max(0, req.num_tokens - self.decoder_keep) if self.decoder_keep else hit
        if ring is not None and hit <= lo:
            self.stats["ring_hits"] += 1
            req.num_cached = hit
            if self.drafter:
                # The snapshot holds the drafter's window before the hit as its writer had it:
                # complete (that writer's own hit restored the same, or its replay or prompt
                # fed every row), so the drafter's context is whole from the start.
                req.draft_from = 0
            return
        self.stats["ring_misses"] += 1
        # Without a ring, or (V4.1) when the decoder's rows start before the hit: the encoder
        # replays from there with a fresh window (its entries before the hit stay cached).
        start = min(max(0, hit - self.replay_tokens), lo)
        self.stats["replayed_tokens"] += hit - start
        req.num_cached = req.window_floor = start

    def _edges_to_tail(self, block: int, pos: int, slot: int) -> None:
        """The compressor tails at `pos` (a block boundary) from the edges of the block ending
        there: the last `ratio` rows' first halves, the only tail rows a later entry reads."""
        for lc in self.pool.layers:
            pairs = (
                (lc.tail_kv, lc.edge_kv), (lc.tail_gate, lc.edge_gate),
                (lc.index_tail_kv, lc.index_edge_kv), (lc.index_tail_gate, lc.index_edge_gate),
            )  # fmt: skip
            for tail, edge in pairs:
                if tail is None or edge is None:
                    continue
                r, half = edge.shape[1], edge.shape[2]
                rows = [(pos - r + j) % tail.shape[1] for j in range(r)]
                tail[slot, rows, :half] = edge[block]

    def release(self, req: Request) -> None:
        """Undo acquire (the admission did not go through)."""
        if req.blocks:
            self.blocks.free(req.blocks)
        req.blocks = []
        req.num_cached = req.cache_hit = req.compress_from = req.window_floor = 0
        req.published = req.stored = 0

    def adopt(self, req: Request) -> None:
        """A request whose state arrived from another worker: publish its full blocks here
        (they are already in the store: the sender wrote them)."""
        n = req.num_cached // self.block_size
        req.block_keys = chain_keys(
            self.root, req.key_tokens(0, n * self.block_size), self.block_size
        )
        for i, key in enumerate(req.block_keys):
            self.blocks.publish(req.blocks[i], key)
        req.published = req.stored = n

    # ---- after each step -----------------------------------------------------------------------

    def after_step(self, reqs: list[Request]) -> None:
        """Publish the blocks each request completed, and take ring snapshots at its snapshot
        points (the prefill chunk that ends at its prompt's last block boundary; each block
        boundary of its output, the last of which is kept when it finishes)."""
        bs = self.block_size
        self.copies.poll()  # the previous steps' copies that have landed
        for req in reqs:
            n_full = req.num_cached // bs
            if n_full > req.published:
                self._publish(req, n_full)
            at = req.num_cached
            if at % bs or at <= req.cache_hit or req.slot is None:
                continue
            key = self._ring_key(req.block_keys[at // bs - 1])
            if at == req.snapshot_at:
                self.copies.ring(req.slot, partial(self._keep_ring, key))
            elif at > len(req.prompt_ids):
                self.copies.ring(req.slot, partial(self._ring_landed, req, key))
        self.flush()

    def _ring_landed(self, req: Request, key: bytes, rec: bytes) -> None:
        # Copies land in order, so the last one to land is the latest boundary's. One that lands
        # after the request finished is kept at once (it is the end of the output).
        if req.finished:
            self._keep_ring(key, rec)
        else:
            req.ring_pending = (key, rec)

    def on_finish(self, req: Request) -> None:
        """The request ends here: keep its end-of-output ring snapshot (one still being copied
        is kept when it lands: `_ring_landed`)."""
        if req.ring_pending is not None:
            self._keep_ring(*req.ring_pending)
            req.ring_pending = None

    def _publish(self, req: Request, n_full: int) -> None:
        bs = self.block_size
        have = len(req.block_keys)
        if have < n_full:
            parent = req.block_keys[-1] if have else self.root
            req.block_keys += chain_keys(parent, req.key_tokens(have * bs, n_full * bs), bs)
        ttl = self.config.agent_ttl_s if req.cache_class == "agent" else self.config.chat_ttl_s
        for i in range(req.published, n_full):
            key, blk = req.block_keys[i], req.blocks[i]
            if not self.blocks.publish(blk, key):
                continue  # another request published this prefix first: ours stays private
            self.stats["published"] += 1
            if key in self.host:
                continue
            ttl_or_none = ttl if i >= req.stored else None
            self.copies.blocks([blk], partial(self._block_landed, key, ttl_or_none))
        req.published = req.stored = n_full

    def _block_landed(self, key: bytes, store_ttl: float | None, rec: bytes) -> None:
        """A published block's record reached the host: keep it, and write it to the store
        unless it came from there (`store_ttl` None)."""
        self.host.put(key, rec)
        if store_ttl is not None:
            self._write(key, rec, store_ttl)

    def _keep_ring(self, key: bytes, rec: bytes) -> None:
        self.stats["snapshots"] += 1
        self.rings.put(key, rec, self.config.ring_ttl_s)
        self._write(key, rec, self.config.ring_ttl_s)

    def _bad(self, key: bytes, err: Exception) -> None:
        """A record that fails its checks is a miss; it is dropped from every tier."""
        self.stats["bad_records"] += 1
        log.warning("prefix cache: dropped a bad record %s: %s", key.hex()[:16], err)
        self.host.discard(key)
        self.rings.discard(key)
        if self.store is not None and self._writer is not None:
            self._writer.submit(self._safe, self.store.delete_many, [key])

    # ---- the store's writer --------------------------------------------------------------------

    def _write(self, key: bytes, rec: bytes, ttl: float) -> None:
        if self.store is None:
            return
        if self._pending_writes + len(self._writes) >= _MAX_PENDING_WRITES:
            self.stats["store_writes_dropped"] += 1
            return
        self._writes.append((key, rec, ttl))

    def flush(self) -> None:
        """Hand the step's writes to the writer thread (one batch)."""
        if not self._writes or self._writer is None or self.store is None:
            return
        batch, self._writes = self._writes, []
        self._pending_writes += len(batch)
        fut = self._writer.submit(self._safe, self.store.put_many, batch)
        n = len(batch)
        fut.add_done_callback(lambda _f: self._written(n))

    def _written(self, n: int) -> None:
        self._pending_writes -= n  # (the writer thread: an int store, atomic under the GIL)

    @staticmethod
    def _safe(fn: Callable, arg: list) -> object:
        try:
            return fn(arg)
        except Exception as e:  # noqa: BLE001 - the store degrades to misses, never fails a step
            log.warning("prefix cache: store write failed: %s", e)
            return 0

    def drain(self, timeout: float = 30.0) -> None:
        """Wait (bounded) until every queued store write is done (shutdown, tests)."""
        self.copies.drain()
        self.flush()
        if self._writer is not None:
            self._writer.submit(lambda: None).result(timeout)

    def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()
        self.drain()
        for ex in (self._reader, self._writer):
            if ex is not None:
                ex.shutdown(wait=True, cancel_futures=True)

    def snapshot_point(self, req: Request) -> int | None:
        """Where a request's prompt prefill stops once, so its ring can be snapshotted at the
        prompt's last block boundary (None: no snapshot, e.g. the hit already reaches it)."""
        at = len(req.prompt_ids) // self.block_size * self.block_size
        return at if at > max(req.cache_hit, req.num_cached) else None

    def report(self) -> dict:
        out = dict(self.stats)
        out.update(
            device_blocks=self.blocks.num_cached,
            device_evictions=self.blocks.num_evictions,
            host_blocks=len(self.host),
            host_bytes=self.host.bytes,
            ring_snapshots=len(self.rings),
            ring_bytes=self.rings.bytes,
            ring_expired=self.rings.stats["expired"],
            host_evictions=self.host.stats["evictions"],
        )
        if self.store is not None:
            out.update({f"store_{k}": v for k, v in self.store.stats().items()})
        return out
