#!/usr/bin/env python3
"""Expected word splits for ops/tokenizer/pretokenizer_test.cc, from the Python `regex` module.

llama.cpp pre-tokenizes byte-level BPE text with a list of regexes per `tokenizer.ggml.pre`
type (src/llama-vocab.cpp, llm_tokenizer_bpe): each regex in turn splits every piece produced by
the previous one, and both its matches and the text between matches become pieces
(unicode_regex_split). This script applies the same regex lists with the `regex` module
(leftmost-first alternation, like ECMAScript and Rust's fancy-regex), an implementation
independent of kvd's hand-written matchers. GPT-2's regex is given with its final `|\\s+`
alternative, which llama.cpp's hand-written matcher implements although its regex string
omits it. Test strings avoid codepoints assigned after Unicode 15.1 (kvd's table version).

Command (from the repository root):
  pip install regex
  python3 tools/reference/make_pretokenizer_cases.py > ops/tokenizer/testdata/pretokenizer_cases.jsonl
"""

import json
import sys

import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
         r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

REGEXES = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt-2": [GPT2],
    "llama3": [LLAMA3],
    "qwen2": [QWEN2],
    "smollm": [r"\p{N}", GPT2],
}

TEXTS = [
    "Hello world",
    "Hello, world! How's it going?",
    "I'm sure they'll say we've done it; you'd agree it's 'fine'.",
    "THEY'LL WE'VE I'M IT'S YOU'D",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\r\nend\n",
    "multiple    spaces   before words",
    "numbers 1 12 123 1234 12345 3.14159 1,000,000",
    "x=42+y*(3-z)/7",
    "email: someone@example.com, url: https://example.org/a?b=c&d=e",
    "C++ code: int main() { return 0; }\n",
    "def f(x):\n    return x ** 2\n",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439\u0442\u0435.",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u662f2024\u5e74\u3002",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c \u30ab\u30bf\u30ab\u30ca",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "emoji \U0001F600\U0001F680 party \U0001F389!!",
    "superscripts x\u00b2 + y\u00b3 \u00bd \u2160\u2161",
    "nbsp\u00a0here and\u3000ideographic space",
    "   ",
    "\n",
    "a",
    "'",
    "''s",
    "'s's",
    "don't stop",
    "...!!!???",
    " ?!",
    "hello\n\n\nworld",
    "line one.\nline two!\n\n  indented line",
    "$100 + 50% = <tag> ^caret~ |pipe| `tick`",
    "mixed123abc456",
    "\u00a9 2024 \u2014 all rights reserved \u2122",
    "combining: e\u0301 a\u0308 n\u0303",
    "zero\u200bwidth\u200djoiner",
    "trailing newline\n",
    " \n ",
    "a  \n  b",
]


def split(text, regexes):
    pieces = [text]
    for pattern in regexes:
        rx = regex.compile(pattern)
        out = []
        for piece in pieces:
            last = 0
            for m in rx.finditer(piece):
                if m.start() > last:
                    out.append(piece[last:m.start()])
                if m.end() > m.start():
                    out.append(m.group(0))
                last = m.end()
            if last < len(piece):
                out.append(piece[last:])
        pieces = out
    return pieces


def main():
    for pre, regexes in REGEXES.items():
        for text in TEXTS:
            words = split(text, regexes)
            assert "".join(words) == text
            sys.stdout.write(json.dumps({"pre": pre, "text": text, "words": words},
                                        ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
