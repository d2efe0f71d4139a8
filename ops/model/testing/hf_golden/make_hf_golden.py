#!/usr/bin/env python3
"""Writes tiny Hugging Face checkpoints and their logits as computed by transformers.

    python3 -m venv /tmp/hfref && /tmp/hfref/bin/pip install torch transformers safetensors numpy
    /tmp/hfref/bin/python ops/model/testing/hf_golden/make_hf_golden.py

(used: torch 2.15.0, transformers 5.24.0, safetensors 0.8.0; CPU.)

For each family (llama, qwen2, gemma3) it builds the transformers model class from a tiny config
(LlamaForCausalLM, Qwen2ForCausalLM, Gemma3ForCausalLM), fills it with random weights from a fixed
torch seed (norms near their neutral value, projections ~ 1/sqrt(fan_in), so the logits are far
from uniform), rounds them to the storage dtype, saves it with save_pretrained (config.json +
model.safetensors, exactly what transformers writes), and runs the model in float32 with eager
attention on a fixed token sequence longer than gemma3's sliding window. Output, per family:

  ops/model/testing/hf_golden/<family>/config.json, model.safetensors   the checkpoint
  ops/model/testing/hf_golden/<family>/expected.json                    {"tokens": [...],
      "logits": [[vocab floats] per position]} from transformers' forward pass

The checkpoints cover: llama F32 tied; qwen2 F16 untied with q/k/v biases; gemma3 BF16 tied with
two sliding layers and a global one, query_pre_attn_scalar != head_dim, distinct local and global
RoPE bases, and (1 + w) norms. These are what kvd's HF loader (ops/model/hf_loader.cc) must map
onto its forward pass; hf_loader_test compares its logits with expected.json.
"""
import json
import os

import torch
import transformers

OUT = os.path.dirname(os.path.abspath(__file__))
TOKENS = [3, 17, 42, 5, 60, 11, 29, 0, 63, 8, 50, 21]


def common(vocab=64):
    return dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=256)


def fill(model, gemma):
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1 and "norm" in name:
                center = 0.0 if gemma else 1.0  # gemma norms scale by (1 + w)
                p.copy_(center + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def make(family, model, dtype):
    gemma = family == "gemma3"
    fill(model, gemma)
    # Round the weights to the storage dtype but keep the model in float32: converting the model
    # itself would also round its float buffers (RoPE inv_freq, Gemma's embed_scale), which the
    # checkpoint does not store.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0]
    out = os.path.join(OUT, family)
    os.makedirs(out, exist_ok=True)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(out, extra)
        if os.path.exists(path):
            os.remove(path)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"tokens": TOKENS, "logits": [[float(x) for x in row] for row in logits.tolist()]},
                  f)
    print(family, "saved", sorted(os.listdir(out)))


def main():
    torch.manual_seed(0)
    llama = transformers.LlamaConfig(**common(), num_hidden_layers=2, rms_norm_eps=1e-5,
                                     rope_theta=10000.0, tie_word_embeddings=True,
                                     attn_implementation="eager")
    make("llama", transformers.LlamaForCausalLM(llama), torch.float32)

    qwen2 = transformers.Qwen2Config(**common(), num_hidden_layers=2, rms_norm_eps=1e-6,
                                     rope_theta=1000000.0, tie_word_embeddings=False,
                                     use_sliding_window=False, attn_implementation="eager")
    make("qwen2", transformers.Qwen2ForCausalLM(qwen2), torch.float16)

    gemma = transformers.Gemma3TextConfig(
        **dict(common(), head_dim=16), num_hidden_layers=3, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
        attn_implementation="eager")
    make("gemma3", transformers.Gemma3ForCausalLM(gemma), torch.bfloat16)


if __name__ == "__main__":
    main()
