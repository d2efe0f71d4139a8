#!/usr/bin/env python3
"""Expected chat prompts for ops/chat/chat_template_test.cc, rendered by Jinja2.

The reference is the models' own Jinja chat templates rendered with Jinja2 (as Hugging Face's
apply_chat_template does), independent of kvd's native renderers:
  - smollm2: the tokenizer.chat_template stored in SmolLM2-135M-Instruct.Q4_1.gguf.
  - llama3:  Meta-Llama-3-8B-Instruct's template (copied below), with bos_token="" because kvd
             leaves BOS to the tokenizer.
Each line: {"template", "messages", "add_generation_prompt", "text"}.

Command (from the repository root; needs the model file from tools/fetch_models.sh):
  pip install jinja2 gguf
  python3 tools/reference/make_chat_cases.py > ops/chat/testdata/chat_cases.jsonl
"""

import json
import os
import sys

import jinja2
from gguf import GGUFReader

SMOLLM2 = os.path.expanduser("~/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf")

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why?"}],
    [{"role": "user", "content": "  padded \n"}, {"role": "assistant", "content": "ok\n\n"},
     {"role": "user", "content": "\tmore"}],
    [{"role": "user", "content": "multi\nline\n\ncontent"},
     {"role": "assistant", "content": "caf\u00e9 \u4f60\u597d \U0001F600"}],
    [{"role": "system", "content": " sys "}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [],
]


def smollm2_template():
    field = GGUFReader(SMOLLM2).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def main():
    env = jinja2.Environment()
    templates = {"smollm2": env.from_string(smollm2_template()),
                 "llama3": env.from_string(LLAMA3)}
    for name, tmpl in templates.items():
        for messages in CONVERSATIONS:
            for add_generation_prompt in (False, True):
                text = tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token="")
                sys.stdout.write(json.dumps({
                    "template": name, "messages": messages,
                    "add_generation_prompt": add_generation_prompt, "text": text,
                }, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
