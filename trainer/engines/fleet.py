"""The replicas of a run's engine as one: every hand-over phase on all of them, and one answer.

    before the update   collocated: pause, sleep (the accelerators are the trainer's while it trains)
    deliver version v   collocated: wake the weights; then the weights (disk: each replica loads the staged
                        checkpoint; distributed: begin, every bucket broadcast from the trainer while each replica
                        receives it, end labelled v); collocated: wake the KV cache; reset the prefix cache; resume

A phase that any replica fails aborts the hand-over: every replica is put back
on the last committed version by the disk path and resumed, and the loop
aborts the update (the gateways resume on the old version) and tries again.
Between updates `watch` asks each replica which version it holds: one that
restarted (it answers its launch label) is brought to the current version.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from trainer.config import EngineConfig
from trainer.engines.base import GroupInfo, Replica, buckets
from trainer.engines.broadcast import CheckpointSender, Sender
from trainer.engines.sglang import SglangReplica
from trainer.engines.tether import TetherReplica
from trainer.engines.vllm import VllmReplica
from trainer.errors import EngineError

log = logging.getLogger("tether.trainer.engines")
_groups = itertools.count(1)


def open_replica(kind: str, url: str, timeout_s: float) -> Replica:
    kinds: dict[str, Callable[[str, float], Replica]] = {"tether": TetherReplica, "vllm": VllmReplica,
                                                         "sglang": SglangReplica}
    return kinds[kind](url, timeout_s)


class EngineFleet:
    def __init__(self, config: EngineConfig, replicas: Sequence[Replica] | None = None,
                 sender: Sender | None = None) -> None:
        """`sender`: the trainer's side of the weight group (distributed), where the backend holds the weights; by
        default the staged checkpoint read back in this process."""
        self.config = config
        self.replicas = list(replicas) if replicas is not None else [
            open_replica(config.kind, url, config.timeout_s) for url in config.urls]
        self.sender = sender or CheckpointSender(config.kind, config.group_device)
        self._joined = False  # the sender and every replica in one group
        self._lock = asyncio.Lock()  # one hand-over (or bring-up) at a time
        self._asleep = False  # collocated, between before_update and deliver: the trainer's turn
        self._suspect: set[str] = set()  # replicas a rollback could not put back: reloaded whatever they say

    async def _all(self, phase: Callable[[Replica], Awaitable[Any]]) -> None:
        """The phase on every replica at once; the first failure is raised once all have answered."""
        results = await asyncio.gather(*(phase(r) for r in self.replicas), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0] if isinstance(failures[0], EngineError) else EngineError(repr(failures[0]))

    # -- the hand-over --------------------------------------------------------------

    async def before_update(self, committed: tuple[Path, int]) -> None:
        """Collocated: the replicas stop and give up their accelerator memory while the trainer trains. A replica
        that refuses puts every replica back, awake, on `committed` (a sleep at level 2 dropped the weights), and
        the failure is raised."""
        if not self.config.collocated:
            return
        async with self._lock:
            self._asleep = True
            try:
                await self._all(lambda r: r.pause())
                await self._all(lambda r: r.sleep(self.config.sleep_level))
            except EngineError as exc:
                log.warning("the replicas could not all sleep (%s): waking them on version %d", exc, committed[1])
                await self._restore(*committed)
                self._asleep = False
                raise

    async def deliver(self, folder: Path, version: int, fallback: tuple[Path, int]) -> None:
        """Version `version` (staged in `folder`) onto every replica. On failure every replica is put back on
        `fallback` (the last committed checkpoint and its version) and the failure is raised."""
        async with self._lock:
            try:
                if not self.config.collocated:
                    await self._all(lambda r: r.pause())
                else:
                    await self._all(lambda r: r.wake(["weights"]))
                if self.config.transfer == "disk":
                    await self._all(lambda r: r.load(folder, version))
                else:
                    await self._transfer(folder, version)
                if self.config.collocated:
                    await self._all(lambda r: r.wake(["kv_cache"]))
                await self._all(lambda r: r.reset_cache())
                await self._all(lambda r: r.resume())
                self._asleep = False
            except EngineError as exc:
                log.warning("version %d: hand-over failed (%s); putting every replica back on version %d",
                            version, exc, fallback[1])
                await self._restore(*fallback)
                self._asleep = False
                raise

    async def _transfer(self, folder: Path, version: int) -> None:
        if self._joined and not self.sender.joined():  # its side went away (verl's workers restarted)
            self._drop_sender()
            await asyncio.gather(*(r.abandon() for r in self.replicas), return_exceptions=True)
        if not self._joined:
            await self._join()
        try:
            await self._all(lambda r: r.begin())
            for bucket in buckets(folder, self.config.bucket_mb << 20):
                sending = asyncio.ensure_future(asyncio.to_thread(self.sender.send, bucket))
                receiving = [asyncio.ensure_future(r.receive(bucket)) for r in self.replicas]
                await _first_failure([sending, *receiving])
            await self._all(lambda r: r.end(version))
        except BaseException:
            self._drop_sender()  # a broken broadcast leaves the group unusable: the next hand-over forms a new one
            await asyncio.gather(*(r.abandon() for r in self.replicas), return_exceptions=True)
            raise

    async def _join(self) -> None:
        """The trainer (rank 0) and every replica's workers (from rank 1, replica after replica) form a group."""
        sizes = [await r.workers() for r in self.replicas]
        address, port = await asyncio.to_thread(self.sender.endpoint, self.config.group_address,
                                                self.config.group_port)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        world = 1 + sum(sizes)
        name = f"tether-weights-{next(_groups)}"
        def group(offset: int) -> GroupInfo:
            return GroupInfo(address=address, port=port, rank_offset=offset, world_size=world,
                             name=name, backend=self.config.group_backend, timeout_s=self.config.group_timeout_s)
        groups = [group(o) for o in offsets]
        joining = asyncio.ensure_future(asyncio.to_thread(self.sender.join, group(0)))
        replicas = [asyncio.ensure_future(r.join(g)) for r, g in zip(self.replicas, groups, strict=True)]
        try:
            await _first_failure([joining, *replicas])
        except BaseException:
            self._drop_sender()
            raise
        self._joined = True
        log.info("weight group %s formed: %d ranks on %s:%d (%s)", name, world, address, port,
                 self.config.group_backend)

    def _drop_sender(self) -> None:
        self._joined = False
        with contextlib.suppress(Exception):
            self.sender.leave()

    async def _restore(self, folder: Path, version: int) -> None:
        """Best effort, replica by replica: awake, the fallback loaded from disk, the cache reset, resumed."""
        async def back(replica: Replica) -> None:
            if self.config.collocated:
                await replica.wake(["weights", "kv_cache"])
            await replica.load(folder, version)
            await replica.reset_cache()
            await replica.resume()
        results = await asyncio.gather(*(back(r) for r in self.replicas), return_exceptions=True)
        for replica, result in zip(self.replicas, results, strict=True):
            if isinstance(result, BaseException):
                self._suspect.add(replica.url)
                log.error("replica %s could not be put back on version %d: %s", replica.url, version, result)

    # -- replicas that fell behind ------------------------------------------------

    async def bring_up(self, folder: Path, version: int, *, settle: bool = False) -> list[str]:
        """Every replica behind `version` (or with no version of the run, as after a restart) loads it (disk path);
        the URLs of those that did. A replica ahead is in a hand-over whose commit is still to come, and is left
        alone, unless `settle` (the trainer starting: an uncommitted version is put back) or its rollback failed."""
        async with self._lock:
            if self._asleep:
                return []  # the trainer's turn: the hand-over that ends it brings every replica up
            held = await asyncio.gather(*(r.held() for r in self.replicas), return_exceptions=True)
            behind = [r for r, h in zip(self.replicas, held, strict=True) if not isinstance(h, BaseException)
                      and (h is None or h < version or (settle and h != version) or r.url in self._suspect)]
            if behind and self._joined:  # a restarted replica left the weight group: form it anew
                self._drop_sender()
                await asyncio.gather(*(r.abandon() for r in self.replicas), return_exceptions=True)
            for replica in behind:
                log.warning("replica %s holds %s, not version %d: loading %s", replica.url,
                            held[self.replicas.index(replica)], version, folder)
                await replica.pause()
                await replica.load(folder, version)
                await replica.reset_cache()
                await replica.resume()
                self._suspect.discard(replica.url)
            return [r.url for r in behind]

    async def watch(self, current: Callable[[], tuple[Path, int]]) -> None:
        """Forever: every `check_every_s`, replicas that restarted (or missed a version) are brought up to the
        current one. A replica not answering is left to come back; a failed bring-up is tried again next time."""
        while True:
            await asyncio.sleep(self.config.check_every_s)
            try:
                await self.bring_up(*current())
            except EngineError as exc:
                log.warning("bringing a replica up failed: %s", exc)

    async def aclose(self) -> None:
        self._drop_sender()
        for replica in self.replicas:
            await replica.aclose()


async def _first_failure(tasks: list[asyncio.Future[Any]]) -> None:
    """All of them, or the first failure at once (a broadcast blocked on a replica that refused is abandoned)."""
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            for other in pending:
                other.cancel()
            error = task.exception()
            assert error is not None
            raise error if isinstance(error, EngineError) else EngineError(f"weight group: {error!r}") from error
