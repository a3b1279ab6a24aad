"""Model side of the LoRA fine-tune: load (or build) the base model and tokenizer,
wrap it with a LoRA adapter (peft), save/load the checkpoint, and generate answers.

A checkpoint directory (``outputs/adapter``) holds the peft adapter, the run config
``lora_sft.json`` (base model, tokenizer kind, labels, eval settings) and, for
``--tiny-random`` runs, the character tokenizer; the tiny base model itself is saved
beside it in ``outputs/base-model``. The Hugging Face token, when needed, is read from
the ``HF_TOKEN`` environment variable and never printed.
"""

import json
import os
import sys

import device as devices
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from sft import CharTokenizer, prompt_ids
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

RUN_CONFIG = "lora_sft.json"
CHAR_TOKENIZER = "char_tokenizer.json"
TINY_BASE_DIR = "base-model"  # beside the adapter directory
# transformers renamed ``torch_dtype=`` to ``dtype=`` in 4.56; support both sides.
_TF_VERSION = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
_DTYPE_KW = "dtype" if _TF_VERSION >= (4, 56) else "torch_dtype"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class HFTokenizer:
    """A transformers tokenizer behind the small interface ``sft`` uses."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else tokenizer.eos_token_id

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def device_and_dtype():
    """The torch device and dtype for this machine (``device.py``): ``DEVICE`` from the
    environment if set, else CUDA, then MPS, then CPU; bfloat16 on CUDA, float32
    elsewhere. A requested device that is not there falls back to CPU with a warning."""
    resolved = devices.resolve_device()
    if resolved.warning:
        print(f"warning: {resolved.warning}", file=sys.stderr, flush=True)
    return torch.device(resolved.device), getattr(torch, devices.dtype_name(resolved.device))


def hf_token():
    """The Hugging Face token from ``HF_TOKEN`` (None when unset), for gated models."""
    return os.environ.get("HF_TOKEN") or None


def tiny_random_model(tokenizer, seed):
    """A 2-layer Llama with hidden size 32 and random weights, sized to ``tokenizer``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def load_pretrained(model_id, dtype):
    """Download (or reuse the cache of) ``model_id``: tokenizer and causal LM."""
    token = hf_token()
    tokenizer = AutoTokenizer.from_pretrained(model_id, token=token)
    model = AutoModelForCausalLM.from_pretrained(model_id, token=token, **{_DTYPE_KW: dtype})
    return HFTokenizer(tokenizer), model


def add_lora(model, rank, alpha, dropout, tiny):
    """Wrap ``model`` with a LoRA adapter on its attention and MLP projections.

    Tiny random models also train their embeddings and output head (``modules_to_save``):
    with random weights there is nothing to adapt otherwise.
    """
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=LORA_TARGETS,
        modules_to_save=["embed_tokens", "lm_head"] if tiny else None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def save_tiny_base(model, adapter_dir):
    """Save a ``--tiny-random`` base model beside the adapter directory, before LoRA
    wraps it (it exists nowhere else)."""
    model.save_pretrained(_tiny_base_dir(adapter_dir))


def _tiny_base_dir(adapter_dir):
    return os.path.join(os.path.dirname(os.path.abspath(adapter_dir)), TINY_BASE_DIR)


def save_checkpoint(model, tokenizer, adapter_dir, run_config):
    """Write the adapter, the run config and (tiny runs) the character tokenizer."""
    os.makedirs(adapter_dir, exist_ok=True)
    model.save_pretrained(adapter_dir)
    if isinstance(tokenizer, CharTokenizer):
        tokenizer.save(os.path.join(adapter_dir, CHAR_TOKENIZER))
    with open(os.path.join(adapter_dir, RUN_CONFIG), "w", encoding="utf-8") as fh:
        json.dump(run_config, fh, indent=2, sort_keys=True)


def load_checkpoint(adapter_dir):
    """Load what ``save_checkpoint`` wrote; returns ``(model, tokenizer, run_config)``."""
    with open(os.path.join(adapter_dir, RUN_CONFIG), encoding="utf-8") as fh:
        run_config = json.load(fh)
    device, dtype = device_and_dtype()
    if run_config["tiny_random"]:
        tokenizer = CharTokenizer.load(os.path.join(adapter_dir, CHAR_TOKENIZER))
        base = LlamaForCausalLM.from_pretrained(
            _tiny_base_dir(adapter_dir), **{_DTYPE_KW: torch.float32}
        )
    else:
        tokenizer, base = load_pretrained(run_config["model_id"], dtype)
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.to(device)
    model.eval()
    return model, tokenizer, run_config


@torch.no_grad()
def generate_answer(model, tokenizer, prompt, max_new_tokens):
    """Greedy-decode the model's answer to one prompt; returns the new text only."""
    ids = torch.tensor([prompt_ids(tokenizer, prompt)], device=model.device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return tokenizer.decode(out[0, ids.shape[1] :].tolist())
