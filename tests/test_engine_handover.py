"""One contract for every engine a new weight version is handed to: the embedded engine, and vLLM and SGLang
through fakes that speak their wire format (`tests/fakes/vllm_rl.py`, `tests/fakes/sglang.py`).

Each case runs two replicas as their own processes and the trainer's `EngineFleet` against them: the version
reaches every replica (the fakes hold exactly the checkpoint's tensors, by disk or over a gloo weight group),
the phases come in order, a failed phase puts every replica back on the committed version, a replica that
restarted is brought up to the current one, and collocated replicas sleep through the update.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from infra.processes import free_port, stop
from tests.conftest import spawn
from tests.fakes.held_weights import fingerprint, read_folder
from trainer.config import EngineConfig
from trainer.engines.base import Bucket, GroupInfo, Replica, WakeTag
from trainer.engines.fleet import EngineFleet, open_replica
from trainer.errors import EngineError

CASES = ["tether-disk", "vllm-disk", "vllm-distributed", "sglang-disk", "sglang-distributed"]
MODULE = {"tether": "tether.cli", "vllm": "tests.fakes.vllm_rl", "sglang": "tests.fakes.sglang"}
# The routes each fake must see per hand-over, from the engines' own choreography
WIRE = {
    ("vllm", "disk"): ["/pause", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache", "/resume"],
    ("vllm", "distributed"): ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update",
                              "/reset_prefix_cache", "/resume"],
    ("sglang", "disk"): ["/pause_generation", "/update_weights_from_disk", "/flush_cache", "/continue_generation"],
    ("sglang", "distributed"): ["/pause_generation", "/begin_weight_update", "/update_weights_from_distributed",
                                "/end_weight_update", "/update_weight_version", "/flush_cache",
                                "/continue_generation"],
}
RECEIVE = {"vllm": "/update_weights", "sglang": "/update_weights_from_distributed"}
SLEEP = {"vllm": "/sleep", "sglang": "/release_memory_occupation"}


@dataclass
class Server:
    kind: str
    model: Path
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [MODULE[self.kind], *(["engine", "serve"] if self.kind == "tether" else []),
                "--model", str(self.model), "--port", str(self.port)]
        _, self.process = spawn(args, self.log, f"{self.kind} replica", self.port)

    def restart(self) -> None:
        assert self.process is not None
        stop(self.process)
        self.start()

    async def fake(self) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.url) as client:
            state: dict[str, Any] = (await client.get("/fake/state")).json()
        return state

    async def fail(self, path: str) -> None:
        async with httpx.AsyncClient(base_url=self.url) as client:
            (await client.post("/fake/fail", json={"path": path, "times": 1})).raise_for_status()

    async def sleeping(self) -> bool:
        if self.kind != "tether":
            return bool((await self.fake())["sleeping"])
        async with httpx.AsyncClient(base_url=self.url) as client:
            return bool((await client.get("/is_sleeping")).json()["is_sleeping"])


class Recording:
    """A replica whose phases are written down, in the order the fleet asks them."""

    def __init__(self, replica: Replica, log: list[str]) -> None:
        self.inner, self.log, self.url = replica, log, replica.url

    async def held(self) -> int | None:
        return await self.inner.held()

    async def workers(self) -> int:
        self.log.append("workers")
        return await self.inner.workers()

    async def pause(self) -> None:
        self.log.append("pause")
        await self.inner.pause()

    async def resume(self) -> None:
        self.log.append("resume")
        await self.inner.resume()

    async def sleep(self, level: int) -> None:
        self.log.append("sleep")
        await self.inner.sleep(level)

    async def wake(self, tags: Sequence[WakeTag]) -> None:
        self.log.append(f"wake {'+'.join(tags)}")
        await self.inner.wake(tags)

    async def load(self, folder: Path, version: int) -> None:
        self.log.append("load")
        await self.inner.load(folder, version)

    async def join(self, group: GroupInfo) -> None:
        self.log.append("join")
        await self.inner.join(group)

    async def begin(self) -> None:
        self.log.append("begin")
        await self.inner.begin()

    async def receive(self, bucket: Bucket) -> None:
        if not self.log or self.log[-1] != "receive":
            self.log.append("receive")
        await self.inner.receive(bucket)

    async def end(self, version: int) -> None:
        self.log.append("end")
        await self.inner.end(version)

    async def abandon(self) -> None:
        self.log.append("abandon")
        await self.inner.abandon()

    async def reset_cache(self) -> None:
        self.log.append("reset")
        await self.inner.reset_cache()

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def versions(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Checkpoint folders v1..v3: the tiny model's files, every floating tensor moved by a version's own amount."""
    root = tmp_path_factory.mktemp("versions")
    base = read_folder(tiny_model)
    folders = {0: tiny_model}
    for version in (1, 2, 3):
        folder = root / f"v{version:06d}"
        shutil.copytree(tiny_model, folder)
        moved = {name: (t + 0.01 * version).contiguous() if t.is_floating_point() else t.clone()
                 for name, t in base.items()}
        for path in folder.glob("*.safetensors"):
            path.unlink()
        save_file(moved, str(folder / "model.safetensors"))
        folders[version] = folder
    return folders


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest, tiny_model: Path, tmp_path: Path) -> Iterator[tuple[str, str, list[Server]]]:
    kind, transfer = request.param.split("-")
    servers = [Server(kind, tiny_model, tmp_path / f"replica{i}.log") for i in range(2)]
    try:
        for server in servers:
            server.start()
        yield kind, transfer, servers
    finally:
        for server in servers:
            if server.process is not None:
                stop(server.process)


def fleet(kind: str, transfer: str, servers: list[Server], logs: list[list[str]], collocated: bool = False
          ) -> EngineFleet:
    config = EngineConfig(kind=kind, urls=[s.url for s in servers], transfer=transfer,
                          collocated=collocated, group_backend="gloo", timeout_s=60, check_every_s=0.2,
                          group_timeout_s=15)
    replicas = [Recording(open_replica(kind, s.url, 60), log) for s, log in zip(servers, logs, strict=True)]
    return EngineFleet(config, replicas)


async def holds(fleet_: EngineFleet, servers: list[Server], folder: Path, version: int) -> None:
    """Every replica says it serves `version`, and every fake holds exactly that folder's tensors, unpaused."""
    assert [await r.held() for r in fleet_.replicas] == [version] * len(servers)
    for server in servers:
        if server.kind != "tether":
            state = await server.fake()
            assert state["fingerprint"] == fingerprint(read_folder(folder).items()), server.url
            assert (state["paused"], state["sleeping"]) == (False, False)


async def test_every_replica_gets_each_version_in_the_engines_own_order(
        case: tuple[str, str, list[Server]], versions: dict[int, Path]) -> None:
    kind, transfer, servers = case
    logs: list[list[str]] = [[], []]
    engines = fleet(kind, transfer, servers, logs)
    try:
        for version in (1, 2):
            calls_before = [len((await s.fake())["calls"]) if kind != "tether" else 0 for s in servers]
            await engines.deliver(versions[version], version, (versions[version - 1], version - 1))
            await holds(engines, servers, versions[version], version)
            first = ["workers", "join"] if transfer == "distributed" and version == 1 else []
            weights = ["begin", "receive", "end"] if transfer == "distributed" else ["load"]
            for log in logs:
                assert log == ["pause", *first, *weights, "reset", "resume"]
                log.clear()
            if kind != "tether":
                for server, before in zip(servers, calls_before, strict=True):
                    calls = [c for c in (await server.fake())["calls"][before:] if c not in
                             ("/weight_info", "/model_info", "/fake/fail", "/get_world_size", "/server_info",
                              "/init_weight_transfer_engine", "/init_weights_update_group")]
                    assert _runs(calls) == WIRE[(kind, transfer)], server.url
    finally:
        await engines.aclose()


async def test_a_failed_phase_puts_every_replica_back_on_the_committed_version(
        case: tuple[str, str, list[Server]], versions: dict[int, Path], tmp_path: Path) -> None:
    kind, transfer, servers = case
    engines = fleet(kind, transfer, servers, [[], []])
    try:
        await engines.deliver(versions[1], 1, (versions[0], 0))
        if transfer == "disk":  # a folder without weights: every engine refuses it in its own way
            broken = tmp_path / "v000002"
            shutil.copytree(versions[2], broken)
            for path in broken.glob("*.safetensors"):
                path.unlink()
        else:  # the second replica refuses the broadcast
            broken = versions[2]
            await servers[1].fail(RECEIVE[kind])
        with pytest.raises(EngineError):
            await engines.deliver(broken, 2, (versions[1], 1))
        await holds(engines, servers, versions[1], 1)
        await engines.deliver(versions[2], 2, (versions[1], 1))  # and the next hand-over goes through
        await holds(engines, servers, versions[2], 2)
    finally:
        await engines.aclose()


async def test_a_restarted_replica_is_brought_up_to_the_current_version(
        case: tuple[str, str, list[Server]], versions: dict[int, Path]) -> None:
    kind, transfer, servers = case
    engines = fleet(kind, transfer, servers, [[], []])
    try:
        await engines.deliver(versions[1], 1, (versions[0], 0))
        servers[0].restart()  # back on its launch weights, under its launch label
        assert await engines.replicas[0].held() in (None, 0)
        assert await engines.bring_up(versions[1], 1) == [servers[0].url]
        await holds(engines, servers, versions[1], 1)
        await engines.deliver(versions[2], 2, (versions[1], 1))  # a distributed fleet forms its group again
        await holds(engines, servers, versions[2], 2)
        # ahead of the committed version is a hand-over before its commit: left alone, except by the trainer's
        # start, which puts an uncommitted version back
        assert await engines.bring_up(versions[1], 1) == []
        assert await engines.bring_up(versions[1], 1, settle=True) == [s.url for s in servers]
        await holds(engines, servers, versions[1], 1)
    finally:
        await engines.aclose()


async def test_collocated_replicas_sleep_while_the_trainer_trains(
        case: tuple[str, str, list[Server]], versions: dict[int, Path]) -> None:
    kind, transfer, servers = case
    logs: list[list[str]] = [[], []]
    engines = fleet(kind, transfer, servers, logs, collocated=True)
    try:
        if kind != "tether":  # a replica that refuses to sleep: every replica awake again on the committed version
            await servers[1].fail(SLEEP[kind])
            with pytest.raises(EngineError):
                await engines.before_update((versions[0], 0))
            await holds(engines, servers, versions[0], 0)
            assert await engines.bring_up(versions[0], 0) == []  # and not taken for the trainer's turn
            for log in logs:
                log.clear()
        await engines.before_update((versions[0], 0))
        for server in servers:
            assert await server.sleeping(), server.url
        assert await engines.bring_up(versions[1], 1) == []  # not while the trainer has the accelerators
        await engines.deliver(versions[1], 1, (versions[0], 0))
        await holds(engines, servers, versions[1], 1)
        first = ["workers", "join"] if transfer == "distributed" else []
        weights = ["begin", "receive", "end"] if transfer == "distributed" else ["load"]
        for log in logs:
            assert log == ["pause", "sleep", "wake weights", *first, *weights, "wake kv_cache", "reset", "resume"]
    finally:
        await engines.aclose()


async def test_a_replica_behind_a_key_gets_it_from_the_environment(
        tiny_model: Path, versions: dict[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    url, process = spawn(["tests.fakes.sglang", "--model", str(tiny_model), "--port", str(port), "--api-key",
                          "s3cret-key"], tmp_path / "sglang.log", "FakeSGLang", port)
    try:
        config = EngineConfig(kind="sglang", urls=[url], timeout_s=60)
        monkeypatch.delenv("TETHER_TRAINER_ENGINE_API_KEY", raising=False)
        refused = EngineFleet(config)
        with pytest.raises(EngineError, match="401 Unauthorized"):
            await refused.deliver(versions[1], 1, (versions[0], 0))
        await refused.aclose()
        monkeypatch.setenv("TETHER_TRAINER_ENGINE_API_KEY", "s3cret-key")
        keyed = EngineFleet(config)
        await keyed.deliver(versions[1], 1, (versions[0], 0))
        assert await keyed.replicas[0].held() == 1
        await keyed.aclose()
    finally:
        stop(process)


def _runs(calls: list[str]) -> list[str]:
    """Repeats of one route (a bucket after another) as one."""
    return [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]


def test_buckets_cover_every_tensor_once_within_the_limit(versions: dict[int, Path]) -> None:
    from trainer.engines.base import buckets

    tensors = read_folder(versions[1])
    limit = max(t.numel() * t.element_size() for t in tensors.values())
    seen: dict[str, torch.Tensor] = {}
    for bucket in buckets(versions[1], limit):
        read = bucket.read()
        assert len(read) == 1 or sum(t.numel() * t.element_size() for t in read) <= limit
        assert bucket.dtype_names == [str(t.dtype).removeprefix("torch.") for t in read]
        assert bucket.shapes == [list(t.shape) for t in read]
        seen.update(zip(bucket.names, read, strict=True))
    assert fingerprint(seen.items()) == fingerprint(tensors.items())
