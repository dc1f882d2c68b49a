"""The scale-up's numbers can be trusted: dropout is consistent across passes, a damaged
checkpoint is detected and skipped, and opening a checkpoint runs no code."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from scaleup.checkpoint import (
    CheckpointError,
    checkpoints,
    usable_checkpoint,
    validate_checkpoint,
)
from scaleup.modeling import add_lora
from scaleup.step import _update, batch_logprobs
from scaleup.tests import dist_helpers as H
from scaleup.tests.conftest import small_cfg
from scaleup.tiny import tiny_qwen2, tiny_tokenizer
from scaleup.train import make_optimizer, read_log, train


@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_dropout_acts_in_every_pass_and_the_first_ratio_is_exactly_one(checkpointing):
    """With --lora-dropout 0.3: the training passes do apply dropout (two passes over the
    same batch differ), yet the first inner epoch's ratio is exactly 1 (it replays the
    dropout masks of the logp_old pass), with activation checkpointing off or on. Before,
    dropout was never applied without checkpointing, and with it the first ratio was not 1."""
    def model_and_update(dropout):
        cfg = small_cfg(lora_dropout=dropout, gradient_checkpointing=checkpointing,
                        inner_epochs=2, micro_batch_size=3, learning_rate=1e-3)
        model = add_lora(tiny_qwen2(0, tiny_tokenizer()), cfg)
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:  # so the LoRA branch (where dropout sits) matters
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        torch.manual_seed(0)
        stats = _update(model, make_optimizer(model, cfg), H.fixed_batch(), cfg)
        return model, stats

    model, stats = model_and_update(0.3)
    assert stats["first_epoch_max_abs_log_ratio"] == 0.0
    assert stats["grad_norm"] > 0
    no_dropout, _ = model_and_update(0.0)
    after = {n: p for n, p in model.named_parameters() if p.requires_grad}
    plain = {n: p for n, p in no_dropout.named_parameters() if p.requires_grad}
    assert any(not torch.allclose(after[n], plain[n]) for n in after)  # dropout acted
    batch = H.fixed_batch()
    model.train()
    a, _ = batch_logprobs(model, batch, 3, 3)
    b, _ = batch_logprobs(model, batch, 3, 3)
    assert (a - b)[batch.mask != 0].abs().max() > 1e-4  # two passes, two dropout draws


@pytest.fixture
def run_with_two_checkpoints(tiny_dir, tmp_path):
    out = tmp_path / "run"
    cfg = small_cfg(model=str(tiny_dir), output_dir=str(out), task="digit", steps=4,
                    save_every=2, max_new_tokens=3)
    straight = train(cfg, show_progress=False)["log"]
    assert [c.name for c in checkpoints(out)] == ["step_000004", "step_000002"]
    return out, straight


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damage", ["missing state.json", "truncated weights",
                                    "corrupt optimizer", "corrupt config", "no manifest"])
def test_resume_skips_a_damaged_checkpoint_and_continues_from_the_last_good_one(
        run_with_two_checkpoints, damage):
    out, straight = run_with_two_checkpoints
    latest = out / "checkpoints" / "step_000004"
    if damage == "missing state.json":
        (latest / "state.json").unlink()
    elif damage == "truncated weights":
        _truncate(latest / "adapter_model.safetensors")
    elif damage == "corrupt optimizer":
        (latest / "optimizer.pt").write_bytes(b"\x00" * 64)
    elif damage == "corrupt config":
        (latest / "config.json").write_text("{not json")
    else:
        (latest / "manifest.json").unlink()
    assert validate_checkpoint(latest) is not None
    messages = []
    assert usable_checkpoint(out, messages.append).name == "step_000002"
    assert len(messages) == 1 and "step_000004" in messages[0]
    resumed = train(small_cfg(output_dir=str(out)), resume=True, show_progress=False,
                    say=messages.append)
    assert [r["step"] for r in resumed["log"]] == [0, 1, 2, 3]
    timing = ("step_time_s", "sample_tokens_per_s", "peak_mem_gb")
    assert ([{k: v for k, v in r.items() if k not in timing} for r in resumed["log"]]
            == [{k: v for k, v in r.items() if k not in timing} for r in straight])
    assert any("resuming" in m and "step_000002" in m for m in messages)
    # nothing deleted: the damaged folder was set aside when step 4 was saved again
    assert any(p.name.startswith("step_000004.replaced") for p in (out / "checkpoints").iterdir())
    assert validate_checkpoint(out / "checkpoints" / "step_000004") is None


def test_no_usable_checkpoint_is_one_clear_error(run_with_two_checkpoints, capsys):
    out, _ = run_with_two_checkpoints
    for c in checkpoints(out):
        (c / "state.json").unlink()
    with pytest.raises(CheckpointError, match="no usable checkpoint in .*step_000004: "
                                              "state.json is missing.*step_000002"):
        usable_checkpoint(out, lambda m: None)
    from scaleup.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--output-dir", str(out), "--resume"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no usable checkpoint" in err and "Traceback" not in err
    assert all((c / "adapter_model.safetensors").exists() for c in checkpoints(out))


class _Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_opening_a_checkpoint_never_runs_code_from_it(run_with_two_checkpoints, tmp_path):
    """A checkpoint whose rng.pt holds a pickled object with a __reduce__ (what
    torch.load(weights_only=False) would execute) is refused, and the code never runs."""
    out, _ = run_with_two_checkpoints
    latest = out / "checkpoints" / "step_000004"
    proof = tmp_path / "code-ran"
    with (latest / "rng.pt").open("wb") as f:
        pickle.dump({"torch": _Payload(str(proof))}, f, protocol=2)
    manifest = json.loads((latest / "manifest.json").read_text())
    from scaleup.checkpoint import _sha256

    manifest["files"]["rng.pt"] = {"size": os.path.getsize(latest / "rng.pt"),
                                   "sha256": _sha256(latest / "rng.pt")}
    (latest / "manifest.json").write_text(json.dumps(manifest))  # a consistent manifest
    problem = validate_checkpoint(latest)
    assert problem is not None and "rng.pt does not load in safe mode" in problem
    assert usable_checkpoint(out, lambda m: None).name == "step_000002"
    assert not proof.exists()


def test_rng_states_are_plain_tensors_and_numbers(run_with_two_checkpoints):
    out, _ = run_with_two_checkpoints
    state = torch.load(out / "checkpoints" / "step_000004" / "rng.pt", weights_only=True)
    assert set(state) >= {"torch", "numpy", "python"}
    assert isinstance(state["torch"], torch.Tensor)


def test_resume_log_keeps_the_console_and_log_step_numbers_equal(run_with_two_checkpoints):
    from scaleup.train import console_line

    out, _ = run_with_two_checkpoints
    record = read_log(out / "log.jsonl")[0]
    line = console_line({**record, "kl": float("nan")})
    assert line.startswith(f"step {record['step']} ") and "kl=" not in line


@pytest.mark.parametrize("options", [dict(), dict(lora_dropout=0.3, beta=0.05),
                                     dict(loss_mode="cispo", importance_level="sequence")],
                         ids=["default", "dropout+kl", "cispo+gspo"])
def test_reusing_the_training_forward_for_logp_old_leaves_the_update_unchanged(
        options, monkeypatch):
    """One inner epoch: logp_old = the training forward's logp_new detached (no separate
    pass, as TRL) gives the same gradient and update as the separate no-grad pass, to
    float32 round-off (the same function of the same inputs), with one pass less."""
    import scaleup.step as S

    calls = []
    real = S.batch_logprobs
    monkeypatch.setattr(S, "batch_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    reuses_training_forward = S.reuses_training_forward

    def update(separate):
        calls.clear()
        cfg = small_cfg(inner_epochs=1, separate_logp_old=separate, micro_batch_size=3,
                        learning_rate=1e-3, **options)
        assert reuses_training_forward(cfg) is not separate
        model = H.fixed_policy(cfg)
        torch.manual_seed(0)
        opt = make_optimizer(model, cfg)
        batch = H.fixed_batch()
        stats = _update(model, opt, batch, cfg)
        assert len(calls) == (cfg.beta > 0) + separate  # the reference pass, logp_old's
        return stats, {n: p.detach().clone() for n, p in model.named_parameters()
                       if p.requires_grad}

    (s_sep, p_sep), (s_reuse, p_reuse) = update(True), update(False)
    assert s_sep["first_epoch_max_abs_log_ratio"] == 0.0  # the check, where it is made
    assert s_reuse["first_epoch_max_abs_log_ratio"] != s_reuse["first_epoch_max_abs_log_ratio"]
    for key in ("loss", "grad_norm", "entropy", "clip_ratio/region_mean"):
        assert s_reuse[key] == pytest.approx(s_sep[key], rel=1e-6, abs=1e-7), key
    for n in p_sep:
        torch.testing.assert_close(p_reuse[n], p_sep[n], atol=1e-7, rtol=1e-6, msg=n)


def test_eval_reports_the_damaged_checkpoint_it_skips(run_with_two_checkpoints, capsys):
    """``grpo-scaleup eval`` evaluates the newest usable checkpoint and says which newer
    one it skipped and why (a corrupt file is reported, never used silently)."""
    from scaleup.evaluate import evaluate_run

    out, _ = run_with_two_checkpoints
    _truncate(out / "checkpoints" / "step_000004" / "adapter_model.safetensors")
    capsys.readouterr()
    result = evaluate_run(out, n_problems=2, batch_size=2, n_samples=1, n_boot=50)
    assert result["checkpoint"].endswith("step_000002")
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "skipping checkpoint" in text and "step_000004" in text, text
