"""The embedded engine serves version N with adapter N: switched in on the base it loaded once, its logprobs those
of the merged model, the prefix cache dropped at each switch, and an adapter of another base refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.engine import Engine
from engine.errors import InvalidRequest
from engine.sampling import SamplingParams
from engine.sequences import Request
from tests.test_trainer_backends import good_vs_bad, token_log_probs
from tests.test_trainer_lora import learner, other_base
from trainer import checkpoint, lora
from trainer.advantages import ScoredGroups
from trainer.checkpoint import TrainerState

PROMPT = [4, 5, 6, 7, 8, 9, 10, 11]


def adapters(tiny_model: Path, root: Path, versions: int, **overrides: object) -> list[Path]:
    """Checkpoints of a LoRA run, one per update."""
    subject = learner(tiny_model, None, **overrides)
    out = []
    for version in range(1, versions + 1):
        for _ in range(2):
            subject.update(ScoredGroups.of(good_vs_bad(subject.model)), version=version - 1)
        out.append(checkpoint.commit(root, subject.stage(root, TrainerState(version=version)), version))
    return out


async def served(engine: Engine) -> tuple[list[int], list[float], set[int]]:
    request = Request(prompt_ids=PROMPT, max_tokens=6, sampling=SamplingParams(temperature=0), ignore_eos=True)
    chunks = [c async for c in engine.generate(request)]
    return ([t for c in chunks for t in c.token_ids], [lp for c in chunks for lp in c.logprobs],
            {c.version for c in chunks})


def merged_log_probs(folder: Path, tiny_model: Path, out: Path, tokens: list[int]) -> list[float]:
    merged = AutoModelForCausalLM.from_pretrained(lora.merge(folder, tiny_model, out))
    return token_log_probs(merged, PROMPT + tokens)[len(PROMPT):]


async def test_each_version_is_served_with_its_adapter_on_the_base(tiny_model: Path, tmp_path: Path) -> None:
    first, second = adapters(tiny_model, tmp_path / "run", 2)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    engine = Engine(base, AutoTokenizer.from_pretrained(tiny_model), base=tiny_model)
    engine.start()
    try:
        plain, plain_lp, _ = await served(engine)
        for version, folder in ((1, first), (2, second)):
            await engine.load_checkpoint(str(folder), version)
            assert len(engine.prefixes) == 0  # computed with other weights: dropped
            tokens, logprobs, seen = await served(engine)
            assert seen == {version}
            assert logprobs == pytest.approx(merged_log_probs(folder, tiny_model, tmp_path / f"m{version}", tokens),
                                             abs=1e-4)
        assert engine.adapters.active is not None and (tokens, logprobs) != (plain, plain_lp)
        # one set of LoRA layers, switched in place: the base's weights are the ones it loaded
        names = [n for n, _ in engine.model.named_parameters()]
        assert sum(".lora_A." in n for n in names) == sum(".lora_B." in n for n in names) > 0
        assert len({n.split(".lora_A.")[1] for n in names if ".lora_A." in n}) == 1
    finally:
        engine.stop()


async def test_an_adapter_with_other_settings_replaces_the_active_one(tiny_model: Path, tmp_path: Path) -> None:
    from trainer.config import LoraSettings

    (small,) = adapters(tiny_model, tmp_path / "a", 1)
    (wide,) = adapters(tiny_model, tmp_path / "b", 1, lora=LoraSettings(rank=4, alpha=8, target_modules=["q_proj"]))
    engine = Engine(AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model),
                    base=tiny_model)
    engine.start()
    try:
        await engine.load_checkpoint(str(small), 1)
        await engine.load_checkpoint(str(wide), 2)
        tokens, logprobs, _ = await served(engine)
        assert logprobs == pytest.approx(merged_log_probs(wide, tiny_model, tmp_path / "m", tokens), abs=1e-4)
        adapters_held = {n.split(".lora_A.")[1].split(".")[0] for n, _ in engine.model.named_parameters()
                         if ".lora_A." in n}
        assert adapters_held == {engine.adapters.active}
    finally:
        engine.stop()


async def test_an_adapter_of_another_base_or_whole_weights_after_one_are_refused(tiny_model: Path,
                                                                                  tmp_path: Path) -> None:
    (folder,) = adapters(tiny_model, tmp_path / "run", 1)
    other = other_base(tiny_model, tmp_path / "other")
    engine = Engine(AutoModelForCausalLM.from_pretrained(other), AutoTokenizer.from_pretrained(other), base=other)
    engine.start()
    try:
        with pytest.raises(InvalidRequest, match="was trained on the base at"):
            await engine.load_checkpoint(str(folder), 1)
        assert engine.version == 0 and engine.adapters.active is None  # still serving what it was
    finally:
        engine.stop()
    engine = Engine(AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model),
                    base=tiny_model)
    engine.start()
    try:
        await engine.load_checkpoint(str(folder), 1)
        with pytest.raises(InvalidRequest, match="holds whole weights"):
            await engine.load_checkpoint(str(tiny_model), 2)
        assert engine.version == 1
    finally:
        engine.stop()


async def test_the_fleet_hands_adapters_to_a_running_engine_as_versions(tiny_model: Path, tmp_path: Path) -> None:
    """The trainer's side against `tether engine serve`: the same handshake as whole weights, the same routes."""
    import httpx

    from infra.processes import stop
    from tests.test_engine_handover import Server
    from trainer.config import EngineConfig
    from trainer.engines.fleet import EngineFleet

    folders = adapters(tiny_model, tmp_path / "run", 2)
    server = Server("tether", tiny_model, tmp_path / "engine.log")
    server.start()
    engines = EngineFleet(EngineConfig(kind="tether", urls=[server.url], timeout_s=60, check_every_s=0.2))
    try:
        for version, folder in enumerate(folders, 1):
            await engines.deliver(folder, version, (folders[version - 2] if version > 1 else tiny_model, version - 1))
            assert [await r.held() for r in engines.replicas] == [version]
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                body = (await client.post("/v1/completions", json={
                    "model": str(tiny_model), "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                    "ignore_eos": True, "return_token_ids": True})).json()
            choice = body["choices"][0]
            expected = merged_log_probs(folder, tiny_model, tmp_path / f"m{version}", choice["token_ids"])
            assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-4)
    finally:
        await engines.aclose()
        assert server.process is not None
        stop(server.process)


#: the routes each engine sees per adapter hand-over after the first (the first has no adapter to unload)
ADAPTER_WIRE = {
    "vllm": ["/pause", "/v1/load_lora_adapter", "/update_weight_version", "/reset_prefix_cache", "/resume"],
    "sglang": ["/pause_generation", "/v1/models", "/unload_lora_adapter", "/load_lora_adapter",
               "/update_weight_version", "/flush_cache", "/continue_generation"],
}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_vllm_and_sglang_are_handed_each_adapter_under_one_name(kind: str, tiny_model: Path,
                                                                      tmp_path: Path) -> None:
    """Their LoRA routes through the fakes: each version's adapter under `SERVED_NAME` (vLLM in place, SGLang
    unloaded and loaded), labelled with the version; a failed hand-over puts the previous adapter back."""
    import httpx

    from infra.processes import free_port, stop
    from schemas.adapters import SERVED_NAME
    from tests.conftest import spawn
    from tests.fakes.held_weights import HeldWeights
    from trainer.config import EngineConfig
    from trainer.engines.fleet import EngineFleet
    from trainer.errors import EngineError

    folders = adapters(tiny_model, tmp_path / "run", 3)
    port = free_port()
    module = {"vllm": "tests.fakes.vllm_rl", "sglang": "tests.fakes.sglang"}[kind]
    url, process = spawn([module, "--model", str(tiny_model), "--port", str(port),
                          *(["--enable-lora"] if kind == "sglang" else [])], tmp_path / "fake.log", kind, port,
                         {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"} if kind == "vllm" else None)
    engines = EngineFleet(EngineConfig(kind=kind, urls=[url], timeout_s=60, check_every_s=0.2))
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            async def fake() -> dict[str, object]:
                state: dict[str, object] = (await client.get("/fake/state")).json()
                return state

            for version in (1, 2):
                before = len((await fake())["calls"])  # type: ignore[arg-type]
                await engines.deliver(folders[version - 1], version, (tiny_model, version - 1))
                state = await fake()
                assert [await r.held() for r in engines.replicas] == [version]
                assert state["adapters"] == {SERVED_NAME: HeldWeights.read_adapter(folders[version - 1])}
                calls = [c for c in state["calls"][before:] if c not in ("/weight_info", "/model_info")]  # type: ignore[index]
                expected = ADAPTER_WIRE[kind] if version > 1 else [c for c in ADAPTER_WIRE[kind]
                                                                    if c != "/unload_lora_adapter"]
                assert calls == expected
            cards = (await client.get("/v1/models")).json()["data"]
            assert [c["id"] for c in cards if c.get("parent")] == [SERVED_NAME]
            assert (await client.post("/fake/fail", json={"path": "/resume" if kind == "vllm" else
                                                          "/continue_generation", "times": 1})).is_success
            with pytest.raises(EngineError):
                await engines.deliver(folders[2], 3, (folders[1], 2))
            state = await fake()
            assert state["adapters"] == {SERVED_NAME: HeldWeights.read_adapter(folders[1])}  # back on version 2
            assert [await r.held() for r in engines.replicas] == [2]
    finally:
        await engines.aclose()
        stop(process)
