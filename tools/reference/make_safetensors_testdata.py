#!/usr/bin/env python3
"""Writes the golden test data of ops/safetensors/ with independent reference implementations.

    pip install safetensors numpy ml_dtypes transformers
    python3 tools/reference/make_safetensors_testdata.py [--out ops/safetensors/testdata]

What it writes (all small, committed):

  tensors.safetensors        written by the official `safetensors` package (safetensors.numpy.save_file)
  tensors.expected.json      every tensor's dtype, shape, data_offsets (read back by Python's json from
                             the header) and values: float tensors as the uint32 bit patterns of their
                             exact float32 values (so NaN, -0 and subnormals compare bit for bit), integer
                             tensors as integers. BF16 values come from ml_dtypes (float32 -> bfloat16
                             with round-to-nearest-even); widening bf16/fp16 to float32 is exact, done by
                             numpy/ml_dtypes here and by our C++ code under test.
  config_*.json              Hugging Face config.json files of public models (sources below).
  config_*.expected.json     the fields kvd's HfConfig holds, as transformers' AutoConfig reads them
                             (AutoConfig fills in the per-family defaults, e.g. Gemma 3's text_config).
  config_*.transformers5.json  the same config loaded and saved again by transformers 5, which
                             writes "rope_parameters" and "dtype" instead of rope_theta/rope_scaling
                             and torch_dtype; it must read to the same expected values.
  bad/*.safetensors          hand-crafted hostile files for the table-driven tests and fuzzer seeds.
                             Each is also fed to the official package; the script prints which ones
                             the reference accepts; only "extra_field" (an unknown key in a tensor
                             entry), where kvd is deliberately stricter, may be among them.

Re-running overwrites the outputs; random values come from a fixed numpy seed, so the output is
stable for a given numpy/ml_dtypes/safetensors version.
"""

import argparse
import json
import os
import struct
import tempfile

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

# --------------------------------------------------------------------------------------------
# Valid tensors.


def float_bits(a):
    return [int(x) for x in np.asarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


def make_tensors(out):
    rng = np.random.default_rng(20240611)
    f32_special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38, -1.5], dtype=np.float32)
    f16_special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-24, 2.0**-14, 65504.0, -1 / 3, 2.0**-15],
        dtype=np.float32).astype(np.float16)
    bf16_special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.38e38, -1 / 3, 9.2e-41],
        dtype=np.float32).astype(ml_dtypes.bfloat16)
    tensors = {
        "model.w_f32": rng.standard_normal((4, 5)).astype(np.float32),
        "model.special_f32": f32_special,
        "model.w_f16": rng.standard_normal((3, 7)).astype(np.float32).astype(np.float16),
        "model.special_f16": f16_special,
        "model.w_bf16": (rng.standard_normal((2, 3, 4)) * 100).astype(np.float32).astype(
            ml_dtypes.bfloat16),
        "model.special_bf16": bf16_special,
        "model.big_f32": rng.standard_normal((64, 33)).astype(np.float32),
        "scalar_f32": np.array(3.25, dtype=np.float32),
        "empty_f32": np.zeros((0, 3), dtype=np.float32),
        "ids_i32": np.array([7, -1, 2147483647, -2147483648, 0], dtype=np.int32),
    }
    metadata = {"format": "pt", "written_by": "tools/reference/make_safetensors_testdata.py"}
    path = os.path.join(out, "tensors.safetensors")
    safetensors.numpy.save_file(tensors, path, metadata=metadata)

    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    loaded = safetensors.numpy.load_file(path)
    expected = {"metadata": header["__metadata__"], "data_size": len(raw) - 8 - n, "tensors": []}
    for name, arr in tensors.items():
        entry = header[name]
        back = loaded[name]
        assert back.shape == arr.shape and back.dtype == arr.dtype, name
        item = {
            "name": name,
            "dtype": entry["dtype"],
            "shape": entry["shape"],
            "data_offsets": entry["data_offsets"],
        }
        if arr.dtype.kind == "i":
            item["int_values"] = [int(x) for x in back.reshape(-1)]
        else:
            item["f32_bits"] = float_bits(back.astype(np.float32))
        expected["tensors"].append(item)
    with open(os.path.join(out, "tensors.expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


# --------------------------------------------------------------------------------------------
# Hugging Face configs. Field values as published on the Hugging Face Hub (config.json of each
# repository, copied from memory of the public files); the numbers that also appear in the GGUF
# files kvd uses are checked against them below when those files are cached.

SMOLLM2_135M_INSTRUCT = {  # HuggingFaceTB/SmolLM2-135M-Instruct
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
    "use_cache": True,
    "vocab_size": 49152,
}

QWEN2_0_5B = {  # Qwen/Qwen2-0.5B
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 131072,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

GEMMA3_270M = {  # google/gemma-3-270m
    "_sliding_window_pattern": 6,
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False,
    "use_cache": True,
    "vocab_size": 262144,
}

# google/gemma-3-4b-it: a multimodal config whose text settings sit under "text_config" and rely
# on Gemma3TextConfig's defaults for everything they do not list.
GEMMA3_4B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}

CONFIGS = {
    "config_smollm2_135m_instruct": SMOLLM2_135M_INSTRUCT,
    "config_qwen2_0_5b": QWEN2_0_5B,
    "config_gemma3_270m": GEMMA3_270M,
    "config_gemma3_4b_it": GEMMA3_4B_IT,
}


def load_config(raw):
    """transformers' config object for `raw`, and the config.json transformers writes for it."""
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(raw, f)
        top = AutoConfig.from_pretrained(d)
        out = os.path.join(d, "resaved")
        top.save_pretrained(out)
        with open(os.path.join(out, "config.json")) as f:
            resaved = json.load(f)
    return top, resaved


def expected_config(raw):
    """The fields of kvd's HfConfig, as transformers reads them."""
    top, _ = load_config(raw)
    text = top.get_text_config()

    rope = text.rope_parameters
    if "full_attention" in rope:  # Gemma 3: one RoPE per layer type.
        global_rope, local_rope = rope["full_attention"], rope["sliding_attention"]
    else:
        global_rope, local_rope = rope, None

    def token_ids(key):
        # kvd's rule for a nested text_config: the top level's value (the model one runs, e.g.
        # gemma-3-4b-it's eos [1, 106]), else the text config's, else the family default.
        if key in raw:
            v = getattr(top, key)
        else:
            v = getattr(text, key)
        if v is None:
            return []
        return v if isinstance(v, list) else [v]

    n_layers = text.num_hidden_layers
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * n_layers
    sliding_window = getattr(text, "sliding_window", None) or 0
    dtype = top.dtype if top.dtype is not None else text.dtype
    return {
        "architecture": top.architectures[0],
        "model_type": text.model_type,
        "hidden_size": text.hidden_size,
        "num_hidden_layers": n_layers,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        "intermediate_size": text.intermediate_size,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": text.rms_norm_eps,
        "rope_theta": global_rope["rope_theta"],
        "rope_local_base_freq": local_rope["rope_theta"] if local_rope else 0.0,
        "rope_scaling_type": global_rope.get("rope_type", "default"),
        "rope_scaling_factor": global_rope.get("factor", 1.0),
        "sliding_window": sliding_window,
        "layer_types": list(layer_types),
        "tie_word_embeddings": bool(top.tie_word_embeddings),
        "query_pre_attn_scalar": getattr(text, "query_pre_attn_scalar", None) or 0.0,
        "attention_bias": bool(getattr(text, "attention_bias", False)),
        "bos_token_ids": token_ids("bos_token_id"),
        "eos_token_ids": token_ids("eos_token_id"),
        "hidden_activation": getattr(text, "hidden_activation", None) or text.hidden_act,
        "torch_dtype": str(dtype).replace("torch.", ""),
        "final_logit_softcapping": getattr(text, "final_logit_softcapping", None) or 0.0,
        "attn_logit_softcapping": getattr(text, "attn_logit_softcapping", None) or 0.0,
    }


def check_against_gguf(name, exp):
    """Cross-checks the remembered configs with the GGUF files kvd runs (when cached)."""
    model_dir = os.path.expanduser("~/.cache/kvd/models")
    files = {
        "config_smollm2_135m_instruct": ("SmolLM2-135M-Instruct.Q4_1.gguf", "llama"),
        "config_gemma3_270m": ("gemma-3-270m-q4_k_m.gguf", "gemma3"),
    }
    if name not in files:
        return
    path = os.path.join(model_dir, files[name][0])
    if not os.path.exists(path):
        print(f"  (no {path}; skipped GGUF cross-check)")
        return
    from gguf import GGUFReader

    arch = files[name][1]
    fields = GGUFReader(path).fields

    def get(key):
        return fields[key].contents()

    assert get(f"{arch}.embedding_length") == exp["hidden_size"]
    assert get(f"{arch}.block_count") == exp["num_hidden_layers"]
    assert get(f"{arch}.feed_forward_length") == exp["intermediate_size"]
    assert get(f"{arch}.attention.head_count") == exp["num_attention_heads"]
    assert get(f"{arch}.attention.head_count_kv") == exp["num_key_value_heads"]
    assert get(f"{arch}.context_length") == exp["max_position_embeddings"]
    assert abs(get(f"{arch}.rope.freq_base") - exp["rope_theta"]) < 1e-3
    assert abs(get(f"{arch}.attention.layer_norm_rms_epsilon") - exp["rms_norm_eps"]) < 1e-9
    assert get("tokenizer.ggml.bos_token_id") == exp["bos_token_ids"][0]
    assert get("tokenizer.ggml.eos_token_id") == exp["eos_token_ids"][0]
    if arch == "gemma3":
        assert get("gemma3.attention.sliding_window") == exp["sliding_window"]
        assert get("gemma3.attention.key_length") == exp["head_dim"]
    print(f"  matches {files[name][0]}")


def make_configs(out):
    for name, raw in CONFIGS.items():
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(raw, f, indent=2)
            f.write("\n")
        exp = expected_config(raw)
        _, resaved = load_config(raw)
        assert expected_config(resaved) == exp, name
        with open(os.path.join(out, name + ".transformers5.json"), "w") as f:
            json.dump(resaved, f, indent=2)
            f.write("\n")
        print(name)
        check_against_gguf(name, exp)
        with open(os.path.join(out, name + ".expected.json"), "w") as f:
            json.dump(exp, f, indent=1)
            f.write("\n")


# --------------------------------------------------------------------------------------------
# Hostile files. Base layout: "a" F32 [2] at [0, 8), "b" F16 [3] at [8, 14); 14 data bytes.


def with_header(header_text, data=bytes(14), length=None):
    h = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


def entries(a="[0,8]", b="[8,14]", a_extra="", b_extra=""):
    return ('{"a":{"dtype":"F32","shape":[2],"data_offsets":%s%s},'
            '"b":{"dtype":"F16","shape":[3],"data_offsets":%s%s}}' % (a, a_extra, b, b_extra))


def bad_cases():
    ok = entries()
    return {
        "empty": b"",
        "truncated_length": b"\x10\x00\x00\x00\x00",
        "truncated_header": with_header(ok)[:40],
        "header_length_huge": struct.pack("<Q", 2**64 - 1) + b"{}",
        "header_length_past_end": with_header("{}", data=b"", length=1000),
        "byte_order_mark": with_header("\ufeff" + ok),
        "invalid_json": with_header('{"a":{"dtype":"F32","shape":[2],'),
        "trailing_garbage": with_header(ok + "x"),
        "header_not_object": with_header("[1,2]"),
        "entry_not_object": with_header('{"a":[1]}', data=b""),
        "missing_dtype": with_header('{"a":{"shape":[2],"data_offsets":[0,8]}}', data=bytes(8)),
        "missing_shape": with_header('{"a":{"dtype":"F32","data_offsets":[0,8]}}', data=bytes(8)),
        "missing_offsets": with_header('{"a":{"dtype":"F32","shape":[2]}}', data=bytes(8)),
        "unknown_dtype": with_header(ok.replace('"F16"', '"F17"')),
        "dtype_not_string": with_header(ok.replace('"F16"', "16")),
        "extra_field": with_header(entries(b_extra=',"foo":1')),
        "negative_shape": with_header(ok.replace('"shape":[3]', '"shape":[-3]')),
        "float_shape": with_header(ok.replace('"shape":[3]', '"shape":[3.0]')),
        "huge_shape_value": with_header(ok.replace('"shape":[3]', '"shape":[1e30]')),
        "overflowing_shape": with_header(
            ok.replace('"shape":[3]', '"shape":[4294967296,4294967296,4294967296]')),
        "shape_not_array": with_header(ok.replace('"shape":[3]', '"shape":3')),
        "wrong_size_offsets": with_header(entries(a="[0,12]", b="[12,18]"), data=bytes(18)),
        "offsets_reversed": with_header(entries(b="[14,8]")),
        "offsets_one_value": with_header(entries(b="[8]")),
        "offsets_overlap": with_header(entries(b="[6,12]"), data=bytes(12)),
        "gap_between_tensors": with_header(entries(b="[10,16]"), data=bytes(16)),
        "data_not_covered": with_header(ok, data=bytes(20)),
        "offsets_past_end": with_header(ok, data=bytes(10)),
        "misaligned_bits": with_header('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}',
                                       data=bytes(2)),
        "duplicate_names": with_header(
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', data=bytes(16)),
        "duplicate_field": with_header(entries(b_extra=',"dtype":"F32"')),
        "metadata_not_string": with_header('{"__metadata__":{"k":1}}', data=b""),
        "metadata_not_object": with_header('{"__metadata__":[]}', data=b""),
        "invalid_utf8_name": with_header(b'{"\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                                         data=bytes(8)),
        "deep_nesting": with_header('{"a":' + "[" * 5000 + "]" * 5000 + "}", data=b""),
    }


def make_bad(out):
    bad_dir = os.path.join(out, "bad")
    os.makedirs(bad_dir, exist_ok=True)
    accepted = []
    for name, blob in bad_cases().items():
        with open(os.path.join(bad_dir, name + ".safetensors"), "wb") as f:
            f.write(blob)
        try:
            safetensors.numpy.load(blob)
            accepted.append(name)
        except Exception:  # the reference rejects it: the case is really malformed
            pass
    print("hostile files the official safetensors package accepts (kvd is stricter):", accepted)
    assert set(accepted) <= {"extra_field"}, accepted


def main():
    parser = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "..", "ops", "safetensors",
                                                      "testdata"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print("safetensors", safetensors.__version__, "numpy", np.__version__, "ml_dtypes",
          ml_dtypes.__version__)
    make_tensors(args.out)
    make_configs(args.out)
    make_bad(args.out)


if __name__ == "__main__":
    main()
