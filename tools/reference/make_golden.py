#!/usr/bin/env python3
"""Golden tokenizer and fp32-engine data from llama.cpp (llama-cpp-python).

The reference is llama.cpp, an implementation independent of kvd, reached
through the PyPI package llama-cpp-python 0.3.36 (built from its sdist with
CMAKE_ARGS="-DGGML_NATIVE=ON"), on CPU with 2 threads, with one change: its
CPU GELU runs in exact fp32 instead of through an fp16 lookup table (see
tools/reference/build_llama_cpp_exact.sh; SmolLM2 uses no GELU and is
unaffected, Gemma 3's logits move by ~2e-4 relative L2 without it). It produced
the files under tests/golden/smollm2/ and tests/golden/gemma3/ on 2026-11-29:

  CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36
  tools/reference/build_llama_cpp_exact.sh
  python3 tools/reference/make_f32_gguf.py \
      /root/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 tools/reference/make_f32_gguf.py \
      /root/.cache/kvd/models/gemma-3-270m-q4_k_m.gguf
  LLAMA_CPP_LIB_PATH=/tmp/lcp-exact-lib \
      python3 tools/reference/make_golden.py --model all --part all
  python3 tools/reference/check_f32_reference.py --model all

make_golden.py takes ~35 s for SmolLM2 and ~75 s for Gemma 3 on 2 idle cores
(~20 / ~37 ms per generated token). check_f32_reference.py then confirms
every greedy token and the dumped logits against an independent float64 numpy
forward of both models.

Tokenizer goldens (tokenizer.jsonl, detok.jsonl) come from a vocab-only
llama.cpp model loaded from the *quantized* GGUF, i.e. the file kvd loads.
  tokenizer.jsonl: {"text", "add_special", "parse_special", "ids"} for every
    string of tools/reference/tokenizer_corpus.json under three settings:
    (False, False), (False, True), (True, True); ids from
    llama_tokenize(text.encode("utf-8"), add_special, parse_special).
  detok.jsonl: {"id", "hex", "hex_plain"} for ~2000 token ids (all control,
    user-defined and byte tokens, the first ids and a seeded random sample):
    the bytes of llama_token_to_piece(id, lstrip=0) with special=True ("hex",
    control tokens rendered as their text) and special=False ("hex_plain",
    control tokens render as nothing).

Engine goldens come from the F32 GGUF written by make_f32_gguf.py: every
tensor dequantized to float32 by the Python `gguf` package, so llama.cpp
computes in fp32 with exactly the weights kvd's fp32 mode uses. The context
runs with an fp32 K/V cache (type_k = type_v = GGML_TYPE_F32 = 0), flash
attention off, logits for every position, n_ctx = n_batch = n_ubatch = 1024
(whole prompts in one ubatch), swa_full, 2 threads.
  greedy.jsonl: per prompt {"name", "kind", "prompt", "add_special",
    "prompt_ids", "greedy_ids" (64), "top2_gap" (64: top-1 minus top-2 logit
    at each generated step), "last_prompt_top" (20 x [id, logit] at the last
    prompt position)}. Greedy = argmax of the raw logits computed here (lowest
    id on ties), never llama.cpp's sampler; generation does not stop at EOS.
  logits_<name>.f32: the full logit vector at the last prompt position,
    little-endian float32, for a few prompts.
Chat prompts are written with the model's chat template and tokenized with
add_special=False, parse_special=True; raw prompts with add_special=True,
parse_special=True (adds <bos> for Gemma 3; SmolLM2 adds nothing).
"""

import argparse
import json
import os
import random
import re
import sys
import time

import numpy as np
import llama_cpp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CACHE = os.path.expanduser("~/.cache/kvd/models")
CORPUS = os.path.join(REPO, "tools/reference/tokenizer_corpus.json")
N_GEN = 64
N_TOP = 20
N_CTX = 1024
GGML_TYPE_F32 = 0


def chatml(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def gemma_chat(user: str) -> str:
    return (f"<bos><start_of_turn>user\n{user}<end_of_turn>\n"
            "<start_of_turn>model\n")


MODELS = {
    "smollm2": {
        "src": os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"),
        "f32": os.path.join(CACHE, "ref/SmolLM2-135M-Instruct.Q4_1.f32.gguf"),
        "chat": chatml,
        "dump_logits": ("chat_capital", "raw_story", "long_essay"),
    },
    "gemma3": {
        "src": os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf"),
        "f32": os.path.join(CACHE, "ref/gemma-3-270m-q4_k_m.f32.gguf"),
        "chat": gemma_chat,
        "dump_logits": ("chat_capital", "raw_story"),
    },
}

CHAT_PROMPTS = [
    ("chat_capital", "What is the capital of France?"),
    ("chat_hello", "Hello! How are you today?"),
    ("chat_poem", "Write a short poem about the ocean."),
    ("chat_python", "Write a Python function that checks whether a number "
     "is prime."),
    ("chat_math", "What is 17 times 23? Show your work."),
    ("chat_list", "List five fruits that are red."),
    ("chat_explain", "Explain photosynthesis to a ten-year-old."),
    ("chat_translate", "Translate 'Good morning, my friend' into Spanish "
     "and French."),
    ("chat_summary", "Summarize the plot of Romeo and Juliet in two "
     "sentences."),
    ("chat_advice", "I have a job interview tomorrow. Any tips?"),
    ("chat_json", "Give me a JSON object describing a cat with fields "
     "name, age and color."),
    ("chat_cpp", "How do I reverse a std::vector<int> in C++?"),
    ("chat_french", "Bonjour ! Peux-tu me recommander un bon livre ?"),
    ("chat_history", "Who was Ada Lovelace?"),
]

RAW_PROMPTS = [
    ("raw_story", "Once upon a time, in a small village at the edge of a "
     "great forest, there lived a young girl named Lily. Every morning she"),
    ("raw_code", "def quicksort(arr):\n    if len(arr) <= 1:\n        "
     "return arr\n    pivot = arr[len(arr) // 2]\n"),
    ("raw_list", "Shopping list:\n1. Milk\n2. Eggs\n3."),
    ("raw_numbers", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"),
    ("raw_fact", "The tallest mountain in the world is"),
    ("raw_german", "Es war einmal ein kleiner Hund, der"),
    ("raw_chinese", "从前有一座山，山上有一座庙，"),
    ("raw_html", "<!DOCTYPE html>\n<html>\n<head>\n  <title>"),
    ("raw_recipe", "To make a simple pancake batter, you will need"),
]

LONG_TEXT = (
    "The history of computing is a story of people trying to make machines "
    "do arithmetic faster and more reliably than humans could. In the "
    "seventeenth century, Blaise Pascal built a mechanical calculator to help "
    "his father with tax computations, and Gottfried Leibniz improved on the "
    "design with a machine that could multiply and divide. Two centuries "
    "later, Charles Babbage designed the Difference Engine and then the far "
    "more ambitious Analytical Engine, a general-purpose machine with a store "
    "for numbers and a mill for operating on them. Ada Lovelace wrote notes on "
    "the Analytical Engine that included what many consider the first "
    "computer program, an algorithm for computing Bernoulli numbers. Although "
    "Babbage never finished his engines, his ideas anticipated the structure "
    "of modern computers by more than a hundred years. In the twentieth "
    "century, electromechanical relays and then vacuum tubes made electronic "
    "computation possible. Machines such as the Colossus in Britain and the "
    "ENIAC in the United States were built for wartime work, breaking codes "
    "and computing artillery tables. After the war, the stored-program "
    "concept, in which instructions and data share the same memory, became "
    "the foundation of almost every computer that followed. The invention of "
    "the transistor in 1947 and the integrated circuit a decade later made "
    "computers smaller, cheaper and far more reliable. By the 1970s, the "
    "microprocessor put an entire central processing unit on a single chip, "
    "and personal computers began to appear in homes and offices. Today, "
    "billions of people carry computers in their pockets that are millions "
    "of times more powerful than the room-sized machines of the 1940s. In a "
    "few sentences, the most important lesson of this history is that")

SWA_EXTRA = (
    " Networks changed computing again. In the 1960s and 1970s, researchers "
    "connected machines at universities so that they could share files and "
    "send messages, and the protocols they designed grew into the Internet. "
    "The World Wide Web, proposed by Tim Berners-Lee in 1989, made it easy to "
    "publish and link documents, and within a decade businesses, schools and "
    "governments had moved much of their work online. Search engines indexed "
    "billions of pages, online shops replaced catalogues, and email replaced "
    "many letters. At the same time, software grew more complex. Operating "
    "systems managed memory, files and devices for many programs at once; "
    "compilers translated high-level languages into machine code; databases "
    "stored and queried enormous collections of records. Open source projects "
    "let thousands of volunteers collaborate on code that anyone could read "
    "and change. More recently, machine learning has let computers recognise "
    "speech and images, translate between languages and write text, by "
    "learning patterns from large amounts of data rather than following rules "
    "written by hand. Each of these changes built on the ones before it, and "
    "each was made possible by cheaper and faster hardware. Looking back over "
    "all of these developments, one can see a pattern: every generation of "
    "engineers has been surprised by what the next generation did with the "
    "tools it left behind. To finish the story, the next big change will "
    "probably be")


def prompts_for(model: str):
    """Returns [(name, kind, text, add_special)]."""
    chat = MODELS[model]["chat"]
    out = [(n, "chat", chat(u), False) for n, u in CHAT_PROMPTS]
    out += [(n, "raw", t, True) for n, t in RAW_PROMPTS]
    out.append(("chat_long", "chat", chat(
        "Please summarise the following passage in one sentence.\n\n" +
        LONG_TEXT.rsplit(" In a few sentences", 1)[0]), False))
    out.append(("long_essay", "raw", LONG_TEXT, True))
    if model == "gemma3":
        # Longer than Gemma 3's 512-token sliding window, so that the local
        # layers' window is exercised.
        out.append(("swa_long", "raw", LONG_TEXT + SWA_EXTRA, True))
    return out


def token_piece(vocab, tok: int, special: bool) -> bytes:
    size = 64
    while True:
        buf = (llama_cpp.ctypes.c_char * size)()
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, size, 0, special)
        if n < 0:
            size = -n
            continue
        return bytes(buf[:n])


def detok_ids(model_path: str, n_vocab: int) -> list:
    """All non-normal tokens plus a deterministic sample, about 2000 ids."""
    import gguf  # only needed here
    reader = gguf.GGUFReader(model_path)
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    texts = reader.fields["tokenizer.ggml.tokens"].contents()
    ids = set()
    unused = []
    for i, t in enumerate(types):
        if t == 1:  # NORMAL
            continue
        if t == 3 and re.fullmatch(r"<unused\d+>", texts[i]):
            unused.append(i)  # Gemma has ~6200 of these; sample them.
        else:
            ids.add(i)
    rng = random.Random(1234)
    ids.update(rng.sample(unused, min(len(unused), 64)))
    ids.update(range(min(n_vocab, 300)))
    ids.update(range(n_vocab - 20, n_vocab))
    normal = [i for i, t in enumerate(types) if t == 1 and i not in ids]
    ids.update(rng.sample(normal, max(0, 2000 - len(ids))))
    return sorted(ids)


def write_jsonl(path: str, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")


def make_tokenizer(model: str, out_dir: str) -> None:
    t0 = time.time()
    cfg = MODELS[model]
    llm = llama_cpp.Llama(cfg["src"], vocab_only=True, verbose=False)
    with open(CORPUS, encoding="utf-8") as f:
        corpus = json.load(f)
    rows = []
    for text in corpus:
        for add_special, parse_special in ((False, False), (False, True),
                                           (True, True)):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special,
                               special=parse_special)
            rows.append({"text": text, "add_special": add_special,
                         "parse_special": parse_special, "ids": ids})
    write_jsonl(os.path.join(out_dir, "tokenizer.jsonl"), rows)

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    drows = []
    for i in detok_ids(cfg["src"], llm.n_vocab()):
        drows.append({"id": i,
                      "hex": token_piece(vocab, i, True).hex(),
                      "hex_plain": token_piece(vocab, i, False).hex()})
    write_jsonl(os.path.join(out_dir, "detok.jsonl"), drows)
    print(f"{model}: tokenizer {len(rows)} rows, detok {len(drows)} ids, "
          f"{time.time() - t0:.1f} s", flush=True)


def top_k(logits: np.ndarray, k: int):
    idx = np.argpartition(-logits, k)[:k]
    idx = idx[np.lexsort((idx, -logits[idx]))]  # by logit desc, id asc
    return [[int(i), float(logits[i])] for i in idx]


def make_engine(model: str, out_dir: str, threads: int) -> None:
    cfg = MODELS[model]
    t0 = time.time()
    llm = llama_cpp.Llama(
        cfg["f32"], n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
        n_threads=threads, n_threads_batch=threads, logits_all=True,
        flash_attn=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
        swa_full=True, verbose=False)
    print(f"{model}: loaded in {time.time() - t0:.1f} s", flush=True)
    rows = []
    for name, kind, text, add_special in prompts_for(model):
        t1 = time.time()
        prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special,
                                  special=True)
        assert len(prompt_ids) + N_GEN <= N_CTX, (name, len(prompt_ids))
        llm.reset()
        llm.eval(prompt_ids)
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        last_top = top_k(logits, N_TOP)
        if name in cfg["dump_logits"]:
            logits.astype("<f4").tofile(
                os.path.join(out_dir, f"logits_{name}.f32"))
        t_prefill = time.time() - t1
        greedy, gaps = [], []
        for step in range(N_GEN):
            tok = int(np.argmax(logits))
            top2 = np.partition(logits, -2)[-2:]
            greedy.append(tok)
            gaps.append(float(top2[1]) - float(top2[0]))
            if step + 1 < N_GEN:
                llm.eval([tok])
                logits = np.array(llm.scores[llm.n_tokens - 1],
                                  dtype=np.float32)
        rows.append({"name": name, "kind": kind, "prompt": text,
                     "add_special": add_special, "prompt_ids": prompt_ids,
                     "greedy_ids": greedy, "top2_gap": gaps,
                     "last_prompt_top": last_top})
        text_out = llm.detokenize(greedy, special=True).decode(
            "utf-8", errors="replace")
        print(f"{model}/{name}: {len(prompt_ids)} prompt tokens, prefill "
              f"{t_prefill:.2f} s, total {time.time() - t1:.1f} s, min gap "
              f"{min(gaps):.4f}\n    -> {text_out!r}", flush=True)
    write_jsonl(os.path.join(out_dir, "greedy.jsonl"), rows)
    print(f"{model}: engine goldens in {time.time() - t0:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "gemma3", "all"),
                        default="all")
    parser.add_argument("--part", choices=("tokenizer", "engine", "all"),
                        default="all")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stock-gelu", action="store_true",
                        help="allow stock llama.cpp (fp16-table GELU)")
    args = parser.parse_args()
    models = list(MODELS) if args.model == "all" else [args.model]
    print(f"llama-cpp-python {llama_cpp.__version__}", flush=True)
    for model in models:
        out_dir = os.path.join(REPO, "tests/golden", model)
        os.makedirs(out_dir, exist_ok=True)
        if args.part in ("tokenizer", "all"):
            make_tokenizer(model, out_dir)
        if args.part in ("engine", "all"):
            lib = os.environ.get("LLAMA_CPP_LIB_PATH", "")
            if "exact" not in lib and not args.stock_gelu:
                sys.exit("engine goldens need llama.cpp with exact fp32 GELU: "
                         "run tools/reference/build_llama_cpp_exact.sh and "
                         "set LLAMA_CPP_LIB_PATH=/tmp/lcp-exact-lib (or pass "
                         "--stock-gelu to accept the fp16 GELU table)")
            if not os.path.exists(MODELS[model]["f32"]):
                sys.exit(f"{MODELS[model]['f32']} is missing: run "
                         "tools/reference/make_f32_gguf.py first")
            make_engine(model, out_dir, args.threads)


if __name__ == "__main__":
    main()
