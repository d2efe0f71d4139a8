#!/usr/bin/env python3
"""End to end: the official `openai` Python client against kvd's HTTP API.

Starts tests/e2e:http_server_for_test over SmolLM2 (from the model cache) and
drives it with openai.OpenAI: models, chat (JSON and streaming, with
logprobs streamed per chunk), completions,
the session extension (extra_body={"session_id": ...}, each request carrying
only its new message), API keys, and OpenAI-style errors.

The client lives in a virtualenv (tools/setup.sh --test creates it at
${KVD_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvd/pyenv}); this script re-runs
itself with that interpreter.

  bazel test //tests/e2e:openai_client_test
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_pyenv  # noqa: E402

test_pyenv.require(["openai"], "openai_client_test")

import openai  # noqa: E402

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def start_server(binary, data_dir, keys=""):
    args = [binary, "--model=" + MODEL_FILE, "--data_dir=" + data_dir]
    if keys:
        args.append("--keys=" + keys)
    proc = subprocess.Popen(args, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        sys.exit("server did not start: %r" % line)
    return proc, int(line.split()[1])


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(binary, os.path.join(tmp, "data"),
                                  keys="sk-test:acme,sk-other:beta")
        try:
            run(port)
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
    if FAILURES:
        sys.exit("%d check(s) failed: %s" % (len(FAILURES), FAILURES))
    print("all checks passed")


def run(port):
    base = "http://127.0.0.1:%d/v1" % port
    client = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0)
    other = openai.OpenAI(base_url=base, api_key="sk-other", max_retries=0)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check(len(ids) == 1, "models.list returns the served model: %s" % ids)
    model = ids[0]

    # Chat, JSON and streaming, greedy: the same text both ways.
    messages = [{"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(model=model, messages=messages,
                                       max_tokens=8, temperature=0)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and bool(text),
          "chat completion: %r" % text)
    check(r.choices[0].finish_reason in ("stop", "length"),
          "finish_reason %s" % r.choices[0].finish_reason)
    check(r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0,
          "usage %s" % r.usage)

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    check("".join(pieces) == text,
          "streamed chat equals JSON chat: %r" % "".join(pieces))
    check(finish == r.choices[0].finish_reason, "stream finish_reason")
    check(usage is not None and
          usage.completion_tokens == r.usage.completion_tokens,
          "stream usage chunk")

    # Logprobs, streamed: each chunk carries the logprobs of its own tokens,
    # and together they are the JSON response's, bit for bit.
    want = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0,
        logprobs=True, top_logprobs=3)
    want_lp = [(t.token, t.logprob, [(a.token, a.logprob)
                                     for a in t.top_logprobs])
               for t in want.choices[0].logprobs.content]
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0,
        logprobs=True, top_logprobs=3, stream=True)
    got_lp, pieces, chunks_with_lp = [], [], 0
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.logprobs is not None and choice.logprobs.content:
                chunks_with_lp += 1
                got_lp += [(t.token, t.logprob, [(a.token, a.logprob)
                                                 for a in t.top_logprobs])
                           for t in choice.logprobs.content]
    check(len(want_lp) > 0 and all(len(t[2]) == 3 for t in want_lp),
          "JSON logprobs: %d tokens with 3 alternatives each" % len(want_lp))
    check(got_lp == want_lp,
          "streamed logprobs equal the JSON ones (%d tokens)%s" %
          (len(got_lp), "" if got_lp == want_lp else
           ": %s vs %s" % (got_lp, want_lp)))
    check(chunks_with_lp > 1,
          "logprobs arrive with the deltas (%d chunks carry some)" %
          chunks_with_lp)
    check("".join(pieces) == want.choices[0].message.content,
          "streamed text with logprobs equals JSON text")
    # Greedy: the chosen token is the most likely one.
    check(all(t[1] == t[2][0][1] for t in want_lp),
          "greedy tokens are the top alternative")

    # Completions.
    c = client.completions.create(model=model, prompt="The sky is",
                                  max_tokens=5, temperature=0)
    check(c.object == "text_completion" and c.usage.completion_tokens <= 5,
          "completion: %r" % c.choices[0].text)

    # Sessions: each request carries only the new message.
    turns = ["My favourite number is 7.", "What is my favourite number?"]
    replies = []
    for t in turns:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": t}],
            max_tokens=16, temperature=0,
            extra_body={"session_id": "e2e-chat"})
        replies.append(r.choices[0].message.content)
    check(all(replies), "session replies: %r" % replies)
    info = client.get("/sessions/e2e-chat", cast_to=object)
    check(info["turns"] == 2 and info["tokens"] >= r.usage.prompt_tokens,
          "session holds both turns: %s" % info)
    # The stored conversation is what a stateless request would have had to
    # resend: its second-turn prompt is shorter than the whole conversation.
    full = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": turns[0]},
                  {"role": "assistant", "content": replies[0]},
                  {"role": "user", "content": turns[1]}],
        max_tokens=1, temperature=0)
    # Usage counts as OpenAI's: the whole context, the stored part cached.
    cached = r.usage.prompt_tokens_details.cached_tokens
    check(cached > 0 and r.usage.prompt_tokens - cached <
          full.usage.prompt_tokens,
          "session turn ran %d of %d prompt tokens (%d cached); stateless "
          "runs %d" % (r.usage.prompt_tokens - cached, r.usage.prompt_tokens,
                       cached, full.usage.prompt_tokens))
    check(info["tokens"] == r.usage.prompt_tokens +
          r.usage.completion_tokens,
          "prompt_tokens counts the whole context: %d + %d == %d" %
          (r.usage.prompt_tokens, r.usage.completion_tokens,
           info["tokens"]))

    # Another tenant cannot see the session.
    try:
        other.get("/sessions/e2e-chat", cast_to=object)
        check(False, "other tenant gets 404")
    except openai.NotFoundError:
        check(True, "other tenant gets 404")

    # Errors arrive as the client's exception types.
    try:
        client.chat.completions.create(model=model, messages=messages,
                                       temperature=9)
        check(False, "temperature 9 is refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "temperature",
              "temperature 9 -> 400 param=temperature")
    try:
        openai.OpenAI(base_url=base, api_key="wrong",
                      max_retries=0).models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError:
        check(True, "a wrong key -> 401")
    try:
        client.chat.completions.create(model="gpt-4o", messages=messages)
        check(False, "an unknown model is refused")
    except openai.NotFoundError:
        check(True, "unknown model -> 404")

    client.delete("/sessions/e2e-chat", cast_to=object)
    try:
        client.get("/sessions/e2e-chat", cast_to=object)
        check(False, "deleted session is gone")
    except openai.NotFoundError:
        check(True, "deleted session -> 404")


if __name__ == "__main__":
    main()
