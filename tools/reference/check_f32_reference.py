#!/usr/bin/env python3
"""Cross-checks the llama.cpp engine goldens against a float64 numpy forward.

A second, independent reference for tests/golden/<model>/: a plain numpy
implementation of the two architectures (SmolLM2 = llama, Gemma 3) computing
in float64 from the same F32 GGUF (tools/reference/make_f32_gguf.py). For each
prompt of greedy.jsonl it runs prompt_ids + greedy_ids[:-1] through the model
in one causal pass and reports
  - the relative L2 error of llama.cpp's dumped logits (logits_<name>.f32)
    against float64,
  - whether the argmax at every generated position equals greedy_ids, and the
    worst |top-1 minus top-2| gap disagreement.
It bounds how far the fp32 reference itself is from exact arithmetic, which is
the tolerance a C++ fp32 test can meaningfully ask for.

--gelu-fp16 emulates llama.cpp's CPU GELU, which rounds its input to fp16 and
looks the result up in an fp16 table (GGML_GELU_FP16 in ggml-cpu/vec.h).

Command used (2026-11-29, numpy 2.4.6, gguf 0.19.0):
  python3 tools/reference/check_f32_reference.py --model all
"""

import argparse
import json
import os
import sys

import numpy as np
import gguf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
REF = os.path.expanduser("~/.cache/kvd/models/ref")
F32 = {
    "smollm2": os.path.join(REF, "SmolLM2-135M-Instruct.Q4_1.f32.gguf"),
    "gemma3": os.path.join(REF, "gemma-3-270m-q4_k_m.f32.gguf"),
}


def load(path):
    r = gguf.GGUFReader(path)
    w = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w[t.name] = np.array(t.data, dtype=np.float64).reshape(shape)
    meta = {f.name: f.contents() for f in r.fields.values()
            if not f.types or f.types[0] != gguf.GGUFValueType.ARRAY}
    return w, meta


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, base, neox):
    """x: [T, heads, hd]. neox pairs (i, i + hd/2); otherwise (2i, 2i + 1)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        x0, x1 = x[..., :hd // 2], x[..., hd // 2:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def attention(q, k, v, scale, window):
    """Causal attention; keys with q_pos - k_pos >= window are masked."""
    t = q.shape[0]
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k, rep, axis=1)
    v = np.repeat(v, rep, axis=1)
    qp = np.arange(t)[:, None]
    kp = np.arange(t)[None, :]
    masked = kp > qp
    if window:
        masked |= (qp - kp) >= window
    att = np.einsum("thd,shd->hts", q, k) * scale
    att = np.where(masked[None], -np.inf, att)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", att, v).reshape(t, -1)


def gelu_tanh(x, fp16):
    def g(v):
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) *
                                      (v + 0.044715 * v ** 3)))
    if not fp16:
        return g(x)
    # ggml: |x| >= 10 handled exactly, else fp16(gelu(fp16(x))) from a table.
    xh = x.astype(np.float16).astype(np.float32)
    y = g(xh.astype(np.float32)).astype(np.float16).astype(np.float64)
    y = np.where(x <= -10, 0.0, np.where(x >= 10, x, y))
    return y


def forward_llama(w, meta, ids, out_from):
    a = meta["general.architecture"]
    d = meta[f"{a}.embedding_length"]
    nh = meta[f"{a}.attention.head_count"]
    nkv = meta[f"{a}.attention.head_count_kv"]
    hd = d // nh
    eps = meta[f"{a}.attention.layer_norm_rms_epsilon"]
    base = meta[f"{a}.rope.freq_base"]
    t = len(ids)
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][ids]
    for l in range(meta[f"{a}.block_count"]):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(t, nh, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(t, nkv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, nkv, hd)
        q, k = rope(q, pos, base, False), rope(k, pos, base, False)
        o = attention(q, k, v, 1 / np.sqrt(hd), 0)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    return rms(x[out_from:], w["output_norm.weight"], eps) @ out.T


def forward_gemma3(w, meta, ids, out_from, gelu_fp16):
    d = meta["gemma3.embedding_length"]
    nh = meta["gemma3.attention.head_count"]
    nkv = meta["gemma3.attention.head_count_kv"]
    hd = meta["gemma3.attention.key_length"]
    eps = meta["gemma3.attention.layer_norm_rms_epsilon"]
    base_global = meta["gemma3.rope.freq_base"]
    base_local = 10000.0  # llama.cpp default; the GGUF has no override
    window = meta["gemma3.attention.sliding_window"]
    t = len(ids)
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][ids] * np.float32(np.sqrt(np.float32(d)))
    for l in range(meta["gemma3.block_count"]):
        p = f"blk.{l}."
        local = (l % 6) < 5  # five sliding-window layers per global one
        h = rms(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(t, nh, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(t, nkv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, nkv, hd)
        q = rms(q, w[p + "attn_q_norm.weight"], eps)
        k = rms(k, w[p + "attn_k_norm.weight"], eps)
        base = base_local if local else base_global
        q, k = rope(q, pos, base, True), rope(k, pos, base, True)
        o = attention(q, k, v, 1 / np.sqrt(hd), window if local else 0)
        o = rms(o @ w[p + "attn_output.weight"].T,
                w[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = rms(x, w[p + "ffn_norm.weight"], eps)
        g = gelu_tanh(h @ w[p + "ffn_gate.weight"].T, gelu_fp16)
        f = (g * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        x = x + rms(f, w[p + "post_ffw_norm.weight"], eps)
    return rms(x[out_from:], w["output_norm.weight"], eps) @ \
        w["token_embd.weight"].T


def check(model, gelu_fp16):
    w, meta = load(F32[model])
    gdir = os.path.join(REPO, "tests/golden", model)
    rows = [json.loads(l) for l in open(os.path.join(gdir, "greedy.jsonl"))]
    worst_rel, n_flip, n_pos, worst_gap = 0.0, 0, 0, 0.0
    for row in rows:
        ids = row["prompt_ids"] + row["greedy_ids"][:-1]
        start = len(row["prompt_ids"]) - 1
        if model == "gemma3":
            logits = forward_gemma3(w, meta, ids, start, gelu_fp16)
        else:
            logits = forward_llama(w, meta, ids, start)
        msg = ""
        dump = os.path.join(gdir, f"logits_{row['name']}.f32")
        if os.path.exists(dump):
            ref = np.fromfile(dump, dtype="<f4").astype(np.float64)
            rel = np.linalg.norm(ref - logits[0]) / np.linalg.norm(logits[0])
            worst_rel = max(worst_rel, rel)
            msg = f" dumped-logits relL2 {rel:.2e}"
        top = [tuple(e) for e in row["last_prompt_top"]]
        top_err = max(abs(logits[0][i] - v) for i, v in top)
        argmax = logits.argmax(-1)
        srt = np.sort(logits, axis=-1)
        gaps = srt[:, -1] - srt[:, -2]
        first_flip = None
        for i, (a, b) in enumerate(zip(argmax, row["greedy_ids"])):
            if a != b:
                first_flip = i
                break
        n_check = len(argmax) if first_flip is None else first_flip
        n_pos += len(argmax)
        if first_flip is not None:
            n_flip += 1
        gap_err = float(np.max(np.abs(gaps[:n_check + 1] -
                                      np.array(row["top2_gap"][:n_check + 1]))))
        worst_gap = max(worst_gap, gap_err)
        flip = ("all 64 greedy tokens agree" if first_flip is None else
                f"FIRST DISAGREEMENT at step {first_flip} (reference gap "
                f"{row['top2_gap'][first_flip]:.4f})")
        print(f"{model}/{row['name']}: top-20 max |err| {top_err:.2e}, "
              f"max gap err {gap_err:.2e}{msg}; {flip}", flush=True)
    print(f"{model}: worst dumped-logits relL2 {worst_rel:.2e}, worst gap "
          f"err {worst_gap:.2e}, prompts with a greedy disagreement "
          f"{n_flip}/{len(rows)}", flush=True)
    return n_flip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "gemma3", "all"),
                        default="all")
    parser.add_argument("--gelu-fp16", action="store_true")
    args = parser.parse_args()
    models = list(F32) if args.model == "all" else [args.model]
    flips = sum(check(m, args.gelu_fp16) for m in models)
    sys.exit(1 if flips else 0)


if __name__ == "__main__":
    main()
