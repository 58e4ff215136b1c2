"""Low-rank adapters on the torch learner: only the adapter trains and is checkpointed, the KL reference is the base,
a checkpoint refuses another base, and a merged export is the policy as one plain model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tests.test_trainer_backends import BAD, GOOD, PROMPT, good_vs_bad, response_log_prob, token_log_probs
from trainer import checkpoint, lora
from trainer.advantages import ScoredGroups
from trainer.batch import build_batch
from trainer.checkpoint import TrainerState
from trainer.config import LoraSettings, TrainerConfig
from trainer.errors import CheckpointMismatch, ConfigError
from trainer.learner import TorchLearner
from trainer.step import reference_log_probs, trimmed
from trainer.step import token_log_probs as step_log_probs

LORA = LoraSettings(rank=8, alpha=16)


def config_for(model: Path, **overrides: object) -> TrainerConfig:
    settings: dict[str, object] = {"run_id": "run", "model": model, "lr": 1e-2, "device": "cpu", "lora": LORA,
                                   "checkpoint_dir": Path("/nonexistent"), **overrides}
    return TrainerConfig.model_validate(settings)


def learner(model: Path, found: Path | None = None, **overrides: object) -> TorchLearner:
    return TorchLearner.load(config_for(model, **overrides), torch.device("cpu"), found)


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def other_base(tiny_model: Path, out: Path) -> Path:
    """The tiny model with one weight moved: another base, by its digest."""
    shutil.copytree(tiny_model, out)
    changed = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        next(changed.parameters()).add_(0.01)
    changed.save_pretrained(out)
    return out


def test_only_the_adapter_trains_and_the_policy_moves_toward_the_advantage(tiny_model: Path) -> None:
    subject = learner(tiny_model)
    assert isinstance(subject.model, PeftModel)
    trainable = [n for n, p in subject.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # the optimiser holds the adapter and nothing else
    held = [p for group in subject.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in held} == {id(p) for p in subject.model.parameters() if p.requires_grad}
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    start_good, start_bad = response_log_prob(plain, GOOD), response_log_prob(plain, BAD)
    assert response_log_prob(subject.model, GOOD) == pytest.approx(start_good, abs=1e-5)  # B = 0: the base
    frozen = base_weights(subject.model)
    for _ in range(5):
        subject.update(ScoredGroups.of(good_vs_bad(subject.model)), version=0)
    assert response_log_prob(subject.model, GOOD) > start_good + 0.5
    assert response_log_prob(subject.model, BAD) < start_bad - 0.5
    after = base_weights(subject.model)
    assert after.keys() == frozen.keys() and all(torch.equal(after[n], frozen[n]) for n in frozen)


def test_a_checkpoint_holds_the_adapter_and_restores_weights_and_optimiser(tiny_model: Path, tmp_path: Path) -> None:
    first = learner(tiny_model)
    first.update(ScoredGroups.of(good_vs_bad(first.model)), version=0)
    final = checkpoint.commit(tmp_path, first.stage(tmp_path, TrainerState(version=1)), 1)
    assert lora.is_adapter(final) and all((final / name).exists() for name in lora.ADAPTER_FILES)
    assert not (final / "model.safetensors").exists()
    adapter_bytes = (final / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < (tiny_model / "model.safetensors").stat().st_size / 2
    trained = response_log_prob(first.model, GOOD)
    groups = good_vs_bad(first.model)
    first.update(ScoredGroups.of(groups), version=1)
    went_on = response_log_prob(first.model, GOOD), response_log_prob(first.model, BAD)

    resumed = learner(tiny_model, final)
    assert response_log_prob(resumed.model, GOOD) == pytest.approx(trained, abs=1e-5)
    resumed.update(ScoredGroups.of(groups), version=1)  # the same step only with the optimiser's state restored
    again = response_log_prob(resumed.model, GOOD), response_log_prob(resumed.model, BAD)
    assert again == pytest.approx(went_on, abs=1e-4)


def test_an_adapter_is_refused_on_another_base_and_without_lora_settings(tiny_model: Path, tmp_path: Path) -> None:
    first = learner(tiny_model)
    first.update(ScoredGroups.of(good_vs_bad(first.model)), version=0)
    final = checkpoint.commit(tmp_path / "run", first.stage(tmp_path / "run", TrainerState(version=1)), 1)
    other = other_base(tiny_model, tmp_path / "other-base")
    with pytest.raises(CheckpointMismatch, match="was trained on the base at"):
        learner(other, final)
    with pytest.raises(ConfigError, match="holds an adapter"):
        learner(tiny_model, final, lora=None)


def test_the_kl_reference_is_the_base_with_the_adapter_off(tiny_model: Path) -> None:
    subject = learner(tiny_model, kl_coef=0.1)
    assert subject.reference is subject.model  # no second copy of the model
    first = subject.update(ScoredGroups.of(good_vs_bad(subject.model)), version=0)
    assert first.kl == pytest.approx(0.0, abs=1e-6)  # the adapter starts at zero: the policy is its base
    for _ in range(3):
        metrics = subject.update(ScoredGroups.of(good_vs_bad(subject.model)), version=0)
    assert metrics.kl > 0
    rows = trimmed(build_batch(ScoredGroups.of(good_vs_bad(subject.model)), None, mode="per-task"))
    reference = reference_log_probs(subject.model, subject.reference, rows, 1.0)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert reference is not None
    with torch.no_grad():
        assert torch.allclose(reference, step_log_probs(plain, rows, 1.0)[0], atol=1e-5)
        assert not torch.allclose(reference, step_log_probs(subject.model, rows, 1.0)[0], atol=1e-3)


def test_a_merged_export_is_the_policy_as_one_plain_model(tiny_model: Path, tmp_path: Path) -> None:
    subject = learner(tiny_model)
    for _ in range(3):
        subject.update(ScoredGroups.of(good_vs_bad(subject.model)), version=0)
    final = checkpoint.commit(tmp_path, subject.stage(tmp_path, TrainerState(version=1)), 1)
    merged = AutoModelForCausalLM.from_pretrained(lora.merge(final, tiny_model, tmp_path / "merged"))
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    ids = PROMPT + GOOD + BAD
    assert token_log_probs(merged, ids) == pytest.approx(token_log_probs(subject.model, ids), abs=1e-4)
    assert (tmp_path / "merged" / "tokenizer.json").exists()  # a folder an engine serves as it is


def test_lora_settings_are_checked(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="handed to the engines from disk"):
        config_for(tiny_model, engine={"kind": "vllm", "urls": ["http://127.0.0.1:1"], "transfer": "distributed"})
    assert config_for(tiny_model, engine_url="http://127.0.0.1:1").engine is not None  # the embedded engine serves
    assert config_for(tiny_model).lora == LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules="all-linear")


def test_tether_model_export_merges_an_adapter_and_says_what_it_needs(tiny_model: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tether.cli.main import app

    subject = learner(tiny_model)
    subject.update(ScoredGroups.of(good_vs_bad(subject.model)), version=0)
    final = checkpoint.commit(tmp_path / "run", subject.stage(tmp_path / "run", TrainerState(version=1)), 1)
    runner = CliRunner()
    refused = runner.invoke(app, ["model", "export", "--checkpoint", str(final), "--out", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "--merge" in refused.output
    done = runner.invoke(app, ["model", "export", "--checkpoint", str(final), "--out", str(tmp_path / "merged"),
                               "--merge"])
    assert done.exit_code == 0, done.output
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = PROMPT + GOOD
    assert token_log_probs(merged, ids) == pytest.approx(token_log_probs(subject.model, ids), abs=1e-4)
    other = runner.invoke(app, ["model", "export", "--checkpoint", str(final), "--out", str(tmp_path / "y"),
                                "--merge", "--base", str(other_base(tiny_model, tmp_path / "other"))])
    assert other.exit_code == 2 and "trained on the base at" in other.output


def test_verl_trains_the_same_adapter_as_the_torch_learner_and_checkpoints_it(tiny_model: Path,
                                                                                tmp_path: Path) -> None:
    """verl's own LoRA on its FSDP workers (two, on Ray): both backends start from the same adapter
    (`lora.initial`), take the same first step, and verl's checkpoint is an adapter too: the engines load it, a
    restore takes it back, and it refuses another base."""
    from tests.test_trainer_backends import stale_good_vs_bad
    from trainer.verl.backend import VerlBackend
    from trainer.verl.workers import VerlWorkers

    torch_config = config_for(tiny_model, checkpoint_dir=tmp_path / "torch", lr=1e-3)
    verl_config = config_for(tiny_model, checkpoint_dir=tmp_path / "verl", lr=1e-3, backend="verl", workers=2)
    learner_ = TorchLearner.load(torch_config, torch.device("cpu"), None)
    workers = VerlWorkers.start(verl_config, world_size=2)
    try:
        verl = VerlBackend.open(verl_config, workers, None)
        scored = ScoredGroups.of(stale_good_vs_bad(learner_.model))
        by_torch, by_verl = learner_.update(scored, version=0), verl.update(scored, version=0)
        assert abs(by_torch.loss) > 0.05
        assert by_verl.loss == pytest.approx(by_torch.loss, rel=1e-3, abs=1e-5)
        assert by_verl.grad_norm == pytest.approx(by_torch.grad_norm, rel=1e-3)
        root = verl_config.run_dir
        final = checkpoint.commit(root, verl.stage(root, TrainerState(version=1)), 1)
        assert lora.is_adapter(final) and not (final / "model.safetensors").exists()
        merged = AutoModelForCausalLM.from_pretrained(lora.merge(final, tiny_model, tmp_path / "merged"))
        for response in (GOOD, BAD):
            assert response_log_prob(merged, response) == pytest.approx(
                response_log_prob(learner_.model, response), abs=2e-3)
        verl.update(scored, version=1)  # moves on; the restore goes back to the commit
        restored = VerlBackend.open(verl_config, workers, final)
        again = tmp_path / "again"
        restored.workers.export_weights(again)
        lora.write_base(again, tiny_model, lora.base_digest(tiny_model))
        back = AutoModelForCausalLM.from_pretrained(lora.merge(again, tiny_model, tmp_path / "merged-again"))
        assert response_log_prob(back, GOOD) == pytest.approx(response_log_prob(merged, GOOD), abs=1e-5)
        other = other_base(tiny_model, tmp_path / "other-base")
        with pytest.raises(CheckpointMismatch):
            VerlBackend.open(config_for(other, checkpoint_dir=tmp_path / "verl", backend="verl"), workers, final)
    finally:
        workers.close()
