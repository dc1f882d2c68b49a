"""Loading the policy: transformers model + tokenizer, LoRA from peft, device and dtype."""

from __future__ import annotations

import os
import socket
import threading
import warnings
from pathlib import Path
from urllib.parse import urlparse

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from scaleup.config import TrainConfig


class ModelLoadError(ValueError):
    """The model or tokenizer could not be loaded (the message says which and why)."""


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for but no CUDA GPU is available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on GPU, float32 on CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``, default huggingface.co) accepts a
    TCP connection within ``timeout`` seconds: one quick check instead of transformers'
    retries, which take about a minute to fail offline."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    result: list[bool] = []

    def connect():  # in a thread: name resolution has no timeout of its own
        try:
            with socket.create_connection((endpoint.hostname, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _check_hub_or_cache(name: str) -> None:
    """A hub id with no network: use the local cache only (``HF_HUB_OFFLINE``), failing
    at once, in one line, if the model is not in it."""
    if Path(name).expanduser().exists():
        return
    if not _offline() and not hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = "1"  # the cache only, no retries
    if _offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ModelLoadError(
                f"--model {name!r}: the Hugging Face hub is not reachable (or HF_HUB_OFFLINE "
                "is set) and the model is not in the local cache; pass --model PATH to a "
                "local model folder (save_pretrained output)")


def load_tokenizer(name: str):
    """The tokenizer of ``name`` (hub id or folder), padded on the left for generation."""
    from transformers import AutoTokenizer

    _check_model_location(name)
    _check_hub_or_cache(name)
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # OSError, ValueError, hub errors: all mean "cannot load"
        raise ModelLoadError(f"--model {name!r}: could not load its tokenizer "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:300]})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.chat_template is None:
        raise ModelLoadError(f"--model {name!r}: its tokenizer has no chat template")
    tok.padding_side = "left"
    return tok


def _check_model_location(name: str) -> None:
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"--model {name!r} is a file; expected a model folder or hub id")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"--model {name!r}: the folder has no config.json; expected a "
                                 "transformers model folder (save_pretrained output)")
        return
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelLoadError(f"--model {name!r}: no such folder (and not a hub id 'org/name')")


def load_base_model(name: str, device: torch.device, dtype: torch.dtype):
    """The causal LM ``name`` on ``device`` in ``dtype``, in eval mode (no dropout)."""
    from transformers import AutoModelForCausalLM

    _check_model_location(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except Exception as e:
        raise ModelLoadError(f"--model {name!r}: could not load the model "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:300]})") from None
    return model.to(device).eval()


def add_lora(model, cfg: TrainConfig) -> PeftModel:
    """Wrap ``model`` with a fresh LoRA adapter (B = 0, so it starts as the base model).

    The adapter's weights are float32 even when the base is bfloat16 (peft's
    ``autocast_adapter_dtype``); the base weights are frozen.
    """
    targets = cfg.lora_targets if cfg.lora_targets == "all-linear" else [
        t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM", bias="none")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft reads transformers' deprecated ``is_gradient_checkpointing``: not ours to fix
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)
        torch.manual_seed(cfg.seed)
        try:
            peft_model = get_peft_model(model, lora)
        except ValueError as e:
            raise ModelLoadError(f"--lora-targets {cfg.lora_targets!r}: {e}") from None
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(peft_model)
    peft_model.get_output_embeddings().register_forward_pre_hook(contiguous_input)
    return peft_model.eval()


def contiguous_input(module, args):
    """Forward pre-hook of the LM head (``add_lora`` registers it): its input made contiguous.

    ``generate``'s prefill passes the head ``hidden[:, -1:, :]``, a strided view. With the
    head's weight frozen (``requires_grad=False``, as LoRA leaves it), ``F.linear`` on a
    strided 3-D input does not fold it into one 2-D product: it runs a batched product with
    the weight expanded to every row, which the CPU copies (64 prompts of the 0.5B
    model's 151,936-way bf16 head: a 17 GB copy taking 47 s, once per ``generate`` call,
    measured 2026-12-07). Made contiguous, it is one (rows, hidden) x (hidden, vocab)
    product; an input that is contiguous already passes as it is."""
    return (args[0].contiguous(), *args[1:])


def enable_activation_checkpointing(peft_model) -> None:
    """Recompute the decoder layers' activations in the backward pass (non-reentrant, so
    the frozen inputs need no ``requires_grad``). transformers 5 names it
    ``activation_checkpointing_enable``; 4.x ``gradient_checkpointing_enable``."""
    lm = peft_model.get_base_model()
    kwargs = {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # pragma: no cover - transformers 4.x
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def load_policy(cfg: TrainConfig):
    """``(peft_model, tokenizer, device)`` for ``cfg``: base model + a fresh LoRA adapter."""
    device = resolve_device(cfg.device)
    tokenizer = load_tokenizer(cfg.model)
    base = load_base_model(cfg.model, device, resolve_dtype(cfg.dtype, device))
    return add_lora(base, cfg), tokenizer, device


def stop_token_ids(tokenizer, model) -> list[int]:
    """Token ids that end a turn: the tokenizer's eos (``<|im_end|>`` for Qwen) plus the
    model's generation eos ids (Qwen lists ``<|endoftext|>`` too)."""
    ids = [tokenizer.eos_token_id]
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    return sorted({int(i) for i in ids if i is not None})
