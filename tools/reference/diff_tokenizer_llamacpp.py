#!/usr/bin/env python3
"""Random differential test of kvd's tokenizer against llama.cpp (llama-cpp-python).

Builds random byte strings (words, digits, every kind of whitespace, contractions, many
scripts, emoji, combining marks, control characters, unassigned codepoints, special-token texts
and fragments of them, and invalid UTF-8), tokenizes each with llama.cpp's llama_tokenize under
(add_special, parse_special) = (F,F), (T,T), (F,T) and with kvd
(bazel-bin/ops/tokenizer/tokenize_cli), then detokenizes llama.cpp's ids with llama_detokenize
(remove_special=False, unparse_special=F/T) and with kvd's Decode. Prints every mismatch
(the first few in full) and exits non-zero if any.

Inputs that make llama.cpp throw (a 4-byte UTF-8 form above U+10FFFF) are not generated.

Other pre-tokenizers can be exercised with a copy of a model whose tokenizer.ggml.pre is
changed, e.g. gguf-new-metadata --pre-tokenizer qwen2 IN.gguf OUT.gguf (the SmolLM2
vocabulary then runs through the Qwen2 regex in both implementations).

Command (from the repository root), as run for the tokenizer's first version with
llama-cpp-python 0.3.36 (0 mismatches for SmolLM2, Gemma 3, Gemma 3 without
add_space_prefix, and SmolLM2 relabelled llama-bpe, qwen2, default and gpt-2):
  bazel build //ops/tokenizer:tokenize_cli
  python3 tools/reference/diff_tokenizer_llamacpp.py MODEL.gguf [N_STRINGS] [SEED]
"""

import base64
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile

import llama_cpp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(REPO, "bazel-bin/ops/tokenizer/tokenize_cli")

POOL = [
    "a", "b", "Z", "hello", "World", " the", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\x0b",
    "\x0c", "\xa0", "\u3000", "\u2028", "\x85", "\x1c", "\x1f",
    "'s", "'S", "'t", "'re", "'RE", "'ve", "'ll", "'LL", "'d", "'m", "'M", "'x", "'",
    "0", "1", "12", "123", "1234", "98765", "\u0663\u0664", "\u00b2", "\u00bd", "\u2160", "\u2075",
    ".", ",", "!", "?", "...", "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "=", "+", "$",
    "^", "`", "|", "~", "@", "#", "%", "&", "*", "/", "\\", ":", ";", "\"",
    "\u00e9", "\u00c9", "na\u00efve", "\u00df", "\u0416\u0438\u0437\u043d\u044c", "\u4f60\u597d",
    "\u6771\u4eac", "\u3053\u3093\u306b\u3061\u306f", "\ud55c\uad6d\uc5b4",
    "\u0645\u0631\u062d\u0628\u0627", "\u0928\u092e\u0938\u094d\u0924\u0947", "e\u0301", "\u0301",
    "\u200b", "\u200d", "\ufeff", "\U0001F600", "\U0001F680", "\u2764\ufe0f",
    "\U0001F44B\U0001F3FD", "\u00a9", "\u2122", "\u20ac",
    "\x00", "\x01", "\x07", "\x1b", "\x7f", "\u0378", "\ue000", "\U000e0067", "\U0010ffff",
    "\uffff",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "im_end|>", "<start_of_turn>",
    "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<unused7>", "[multimodal]",
    "<start_of_image>", "\n\n\n", "\t\t\t", "<reponame>", "<file_sep>", "<mask>",
    "user", "model", "assistant", "system", "ing", "tion", " don't", " it's",
]
RAW = [b"\x80", b"\xff", b"\xc3", b"\xe4\xbd", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf",
       b"\xf4\x8f\xbf\xbf", b"\xf8", b"\xfe\xff"]


def above_unicode(b):
    """True if llama.cpp's UTF-8 decoder would produce a codepoint > U+10FFFF (it then throws)."""
    i = 0
    cont = lambda k: i + k < len(b) and (b[i + k] & 0xC0) == 0x80
    while i < len(b):
        c = b[i]
        if c < 0xC0:
            i += 1
        elif c < 0xE0:
            i += 2 if cont(1) else 1
        elif c < 0xF0:
            i += 3 if cont(1) and cont(2) else 1
        elif c < 0xF8 and cont(1) and cont(2) and cont(3):
            v = ((c & 7) << 18) | ((b[i + 1] & 0x3F) << 12) | ((b[i + 2] & 0x3F) << 6) | (b[i + 3] & 0x3F)
            if v > 0x10FFFF:
                return True
            i += 4
        else:
            i += 1
    return False


def random_bytes(rng):
    while True:
        parts = []
        for _ in range(rng.randint(0, 25)):
            r = rng.random()
            if r < 0.06:
                parts.append(rng.choice(RAW))
            elif r < 0.15:
                parts.append(bytes([rng.randint(0, 255)]))
            else:
                parts.append(rng.choice(POOL).encode("utf-8"))
        b = b"".join(parts)
        if not above_unicode(b):
            return b


def run_cli(model, requests):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
        path = f.name
    try:
        out = subprocess.run([CLI, model, path], capture_output=True, check=True).stdout
    finally:
        os.unlink(path)
    return [json.loads(line) for line in out.decode().splitlines()]


def main():
    model = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab

    cases = [(random_bytes(rng), a, p) for _ in range(n)
             for a, p in ((False, False), (True, True), (False, True))]
    mine = run_cli(model, [{"b64": base64.b64encode(b).decode(), "add_special": a,
                            "parse_special": p} for b, a, p in cases])
    bad = 0
    refs = []
    for (b, a, p), got in zip(cases, mine):
        ref = llm.tokenize(b, add_bos=a, special=p)
        refs.append(ref)
        if got["ids"] != ref:
            bad += 1
            if bad <= 5:
                print(f"ENCODE {b!r} add_special={a} parse_special={p}\n  llama.cpp {ref}\n"
                      f"  kvd       {got['ids']}")

    def detokenize(ids, special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 16 * len(ids) + 64
        buf = ctypes.create_string_buffer(size)
        k = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, special)
        assert k >= 0
        return buf.raw[:k]

    dcases = [(ids, s) for ids in refs for s in (False, True)]
    dmine = run_cli(model, [{"decode": ids, "special": s} for ids, s in dcases])
    dbad = 0
    for (ids, s), got in zip(dcases, dmine):
        ref = detokenize(ids, s)
        text = base64.b64decode(got["b64"])
        if text != ref:
            dbad += 1
            if dbad <= 5:
                print(f"DECODE {ids} special={s}\n  llama.cpp {ref!r}\n  kvd       {text!r}")
    print(f"{os.path.basename(model)}: {len(cases)} encodes, {bad} mismatches; "
          f"{len(dcases)} decodes, {dbad} mismatches")
    sys.exit(1 if bad or dbad else 0)


if __name__ == "__main__":
    main()
