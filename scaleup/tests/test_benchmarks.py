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


def _load_rollout_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_rollout",
                                                  BENCH.parent / "bench_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dense_products_of_qwen25_05b_are_its_published_linear_layers(monkeypatch):
    """One decoded token of Qwen2.5-0.5B: per layer q and o (896 x 896), k and v (896 x 128:
    2 key/value heads of 64), gate and up (896 x 4864), down (4864 x 896); 24 layers; and
    the tied head (896 x 151,936): 493,961,216 weights, 0.988 GFLOP a token."""
    bench = _load_rollout_bench(monkeypatch)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2_config(QWEN25_05B_SIZES))
    products = bench.dense_products(model)
    assert {shape: len(ws) for shape, ws in products.items()} == {
        (896, 896): 48, (896, 128): 48, (896, 4864): 48, (4864, 896): 24, (896, 151936): 1}
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert 24 * per_layer + 896 * 151936 == 493_961_216
    assert bench.flops_per_token(products) == 2 * 493_961_216


def test_dense_products_leave_lora_factors_out_and_time_every_weight(monkeypatch):
    """The peft model's products are the base model's (its LoRA factors are not counted);
    the rate is the FLOPs of ``rows`` tokens over the summed fastest time of each shape,
    counted once per weight (a fake clock: 0.25 s a call), and real timing gives a finite
    positive rate."""
    from scaleup.config import TrainConfig
    from scaleup.modeling import add_lora
    from scaleup.tiny import TINY_SIZES, tiny_qwen2

    bench = _load_rollout_bench(monkeypatch)
    base = bench.dense_products(tiny_qwen2())
    peft = bench.dense_products(add_lora(tiny_qwen2(), TrainConfig(lora_r=4, lora_alpha=8)))
    h, i, v = (TINY_SIZES[k] for k in ("hidden_size", "intermediate_size", "vocab_size"))
    kv = TINY_SIZES["num_key_value_heads"] * h // TINY_SIZES["num_attention_heads"]
    expected = {(h, h): 4, (h, kv): 4, (h, i): 4, (i, h): 2, (h, v): 1}
    for products in (base, peft):
        assert {shape: len(ws) for shape, ws in products.items()} == expected
    calls = []

    def fake_timer(fn):
        calls.append(fn)
        return 0.25

    rate = bench.product_rate(peft, rows=3, repeats=2, timer=fake_timer)
    weights = h * h * 4 + h * kv * 4 + h * i * 4 + i * h * 2 + h * v
    assert len(calls) == 2 * len(expected)
    assert rate == pytest.approx(2 * 3 * weights / (0.25 * sum(expected.values())))
    real = bench.product_rate(peft, rows=8)
    assert 0 < real < float("inf")
