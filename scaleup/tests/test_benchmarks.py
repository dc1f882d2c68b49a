"""The GPU benchmark's smoke mode runs on CPU; its model has Qwen2.5-0.5B's size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import Qwen2ForCausalLM

from scaleup.tiny import QWEN25_05B_SIZES, qwen2_config

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "scaleup_gpu.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("scaleup_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_qwen25_05b_architecture_has_the_published_parameter_count():
    """Qwen2.5-0.5B's model card: 0.49B parameters, 0.36B without the embedding."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2_config(QWEN25_05B_SIZES))
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    assert embedding == 151936 * 896
    assert abs(total / 1e9 - 0.49) < 0.005
    assert abs((total - embedding) / 1e9 - 0.36) < 0.005
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied


def test_gpu_benchmark_smoke_mode_on_cpu(tmp_path):
    result = _load_bench().main(["--device", "cpu", "--tiny", "--json", str(tmp_path / "b.json")])
    assert result["sampling"]["tokens"] == 4 * 8  # every sequence forced to full length
    assert result["sampling"]["tokens_per_s"] > 0
    assert [s["micro_batch_size"] for s in result["train_steps"]] == [2, 4]
    assert all(not s["oom"] and s["step_seconds"] > 0 for s in result["train_steps"])
    assert result["fits_8gb"] is None  # unknowable on CPU
    assert (tmp_path / "b.json").exists()


@pytest.mark.parametrize("compare", ["sharing", "fused-head"])
def test_microbatch_benchmark_smoke_mode(tmp_path, monkeypatch, compare):
    """Its quick run times both ways and finds the same log-probs and gradients
    (float32)."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_microbatch",
                                                  BENCH.parent / "bench_microbatch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--quick", "--compare", compare, "--json", str(tmp_path / "s.json")])
    assert result["compare"] == compare and result["on_s"] > 0 and result["off_s"] > 0
    assert result["max_abs_logp_difference"] < 1e-5
    assert result["max_rel_grad_difference"] < 1e-3
    assert (tmp_path / "s.json").exists()
