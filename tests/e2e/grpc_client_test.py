#!/usr/bin/env python3
"""End to end: the official Python gRPC client (grpcio) against `kvd serve`.

Starts `kvd serve` over SmolLM2 (from the model cache) with one generation
slot and no queue, and drives its gRPC API with stubs generated at test time
from proto/kvd/v1/sessions.proto: the standard health service
(grpc.health.v1), server reflection, the receive limit, validation before the
stream starts, admission shared with the HTTP API (RESOURCE_EXHAUSTED with
grpc-retry-pushback-ms), one tokenization rule for raw prompts over gRPC and
HTTP, OpenAI-style usage counting in a session, and the per-method metrics.

The client lives in a virtualenv (tools/setup.sh --test creates it at
${KVD_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvd/pyenv}); this script re-runs
itself with that interpreter.

  bazel test //tests/e2e:grpc_client_test
  python3 tests/e2e/grpc_client_test.py path/to/kvd     (from the repo root)
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_pyenv  # noqa: E402

test_pyenv.require(["grpc", "grpc_health", "grpc_reflection", "grpc_tools"],
                   "grpc_client_test")

import http.client  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2_grpc  # noqa: E402

SESSIONS_PROTO = "proto/kvd/v1/sessions.proto"
FAILURES = []
pb = None  # sessions_pb2, once generated
pb_grpc = None  # sessions_pb2_grpc


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def proto_root():
    """The directory holding proto/kvd/v1/sessions.proto: the working
    directory (Bazel's runfiles root, or the repo root by hand), else the
    repository this script is in."""
    here = os.path.dirname(os.path.realpath(__file__))
    for root in (os.getcwd(), os.path.join(here, "..", "..")):
        if os.path.exists(os.path.join(root, SESSIONS_PROTO)):
            return os.path.abspath(root)
    sys.exit("grpc_client_test: cannot find %s (run from the repo root)" %
             SESSIONS_PROTO)


def generate_stubs(out):
    """Compiles sessions.proto into `out` and imports it."""
    global pb, pb_grpc
    root = proto_root()
    r = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I" + root,
         "--python_out=" + out, "--grpc_python_out=" + out,
         os.path.join(root, SESSIONS_PROTO)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("grpc_client_test: protoc failed:\n" + r.stdout)
    # Regular packages, so that no other `proto` package on sys.path wins.
    for d in ("proto", "proto/kvd", "proto/kvd/v1"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)
    from proto.kvd.v1 import sessions_pb2, sessions_pb2_grpc
    pb, pb_grpc = sessions_pb2, sessions_pb2_grpc


def start_server(binary, tmp):
    config = os.path.join(tmp, "kvd.json")
    with open(config, "w") as f:
        json.dump({"model": "smollm2", "http-port": 0, "grpc-port": 0,
                   "threads": 2, "data-dir": os.path.join(tmp, "data"),
                   "max-inflight": 1, "max-queue": 0}, f)
    log_path = os.path.join(tmp, "serve.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([binary, "serve", "--config", config],
                            stdin=subprocess.DEVNULL, stdout=log,
                            stderr=log)
    log.close()
    deadline = time.time() + 60
    while time.time() < deadline:
        with open(log_path) as f:
            text = f.read()
        http_port = re.search(r"OpenAI API\s+http://127\.0\.0\.1:(\d+)/v1",
                              text)
        grpc_port = re.search(r"gRPC\s+127\.0\.0\.1:(\d+)", text)
        if http_port and grpc_port:
            return proc, log_path, int(http_port.group(1)), \
                int(grpc_port.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    with open(log_path) as f:
        sys.exit("grpc_client_test: server did not start:\n" + f.read())


def main():
    binary = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(
            dir=os.environ.get("TEST_TMPDIR")) as tmp:
        stubs = os.path.join(tmp, "stubs")
        os.mkdir(stubs)
        generate_stubs(stubs)
        proc, log_path, http_port, grpc_port = start_server(binary, tmp)
        started = time.time()
        try:
            run(http_port, grpc_port)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            check(rc == 0, "SIGTERM stops the server cleanly (exit %s)" % rc)
            print("(checks took %.1f s)" % (time.time() - started))
            if FAILURES:
                with open(log_path) as f:
                    print("---- server log (last 40 lines) ----\n" +
                          "".join(f.readlines()[-40:]))
    if FAILURES:
        sys.exit("%d check(s) failed: %s" % (len(FAILURES), FAILURES))
    print("all checks passed")


def http_request(port, method, path, body=None, timeout=30):
    """Returns (status, headers, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body) if body is not None else None
        conn.request(method, path, body=data,
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def generate(stub, request, timeout=30):
    """Runs a Generate to its end: (messages, error), error an RpcError or
    None."""
    messages = []
    call = stub.Generate(request, timeout=timeout)
    try:
        for m in call:
            messages.append(m)
    except grpc.RpcError as e:
        return messages, e
    return messages, None


def finished_of(messages):
    if messages and messages[-1].WhichOneof("event") == "finished":
        return messages[-1].finished
    return None


def greedy(max_tokens, **kw):
    return pb.SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def section(fn, *args):
    """Runs one group of checks; an exception fails the group, not the
    test run."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        check(False, "%s raised %s: %s" % (fn.__name__, type(e).__name__, e))


def run(http_port, grpc_port):
    # No proxy between this client and 127.0.0.1, whatever the environment.
    channel = grpc.insecure_channel("127.0.0.1:%d" % grpc_port,
                                    options=[("grpc.enable_http_proxy", 0)])
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = pb_grpc.SessionsStub(channel)
    section(check_health, channel)
    section(check_reflection, channel)
    section(check_oversized, stub)
    section(check_validation, stub)
    section(check_shared_admission, stub, http_port)
    section(check_tokenization, stub, http_port)
    section(check_usage, stub)
    section(check_metrics, http_port)
    channel.close()


def check_health(channel):
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    check(r.status == serving, "grpc.health.v1 Check(\"\") is SERVING (%s)" %
          health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    r = health.Check(health_pb2.HealthCheckRequest(service="kvd.v1.Sessions"),
                     timeout=10)
    check(r.status == serving, "Check(kvd.v1.Sessions) is SERVING (%s)" %
          health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    try:
        health.Check(health_pb2.HealthCheckRequest(service="nope"),
                     timeout=10)
        check(False, "Check(nope) is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND,
              "Check(nope) -> NOT_FOUND (%s: %s)" % (e.code(), e.details()))


def check_reflection(channel):
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = list(refl.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="kvd.v1.Sessions"),
    ]), timeout=10))
    check(len(responses) == 2,
          "reflection answers both requests (%d answers)" % len(responses))
    services = set()
    if responses and responses[0].HasField("list_services_response"):
        services = {s.name for s in
                    responses[0].list_services_response.service}
    want = {"kvd.v1.Sessions", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"}
    check(want <= services,
          "reflection lists %s (got %s)" % (sorted(want), sorted(services)))
    files = []
    if len(responses) > 1 and \
            responses[1].HasField("file_descriptor_response"):
        files = responses[1].file_descriptor_response.file_descriptor_proto
    check(len(files) > 0 and all(len(f) > 0 for f in files),
          "reflection: file_containing_symbol=kvd.v1.Sessions returns a "
          "file descriptor (%d)" % len(files))


def check_oversized(stub):
    request = pb.GenerateRequest(prompt="a" * (2 << 20), sampling=greedy(1))
    t0 = time.time()
    messages, err = generate(stub, request, timeout=20)
    elapsed = time.time() - t0
    check(err is not None and
          err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and
          not messages and elapsed < 10,
          "a 2 MiB prompt -> RESOURCE_EXHAUSTED in %.2f s (%s: %s)" %
          (elapsed, err and err.code(), err and err.details()))


def check_validation(stub):
    request = pb.GenerateRequest(
        messages=[pb.ChatMessage(role="user", content="Hi")],
        sampling=pb.SamplingParams(temperature=3.0, max_tokens=2))
    messages, err = generate(stub, request)
    check(err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT,
          "temperature 3.0 -> INVALID_ARGUMENT (%s: %s)" %
          (err and err.code(), err and err.details()))
    check(not messages,
          "temperature 3.0: no message before the error (got %d: %s)" %
          (len(messages), [m.WhichOneof("event") for m in messages]))
    request = pb.GenerateRequest(
        messages=[pb.ChatMessage(role="system", content="Be brief.")],
        sampling=greedy(2))
    messages, err = generate(stub, request)
    check(err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
          and not messages,
          "only a system message -> INVALID_ARGUMENT before started (%s: "
          "%s; %d messages)" % (err and err.code(), err and err.details(),
                                len(messages)))


def check_shared_admission(stub, http_port):
    # An HTTP stream holds the only slot (max-inflight 1, max-queue 0).
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps({
        "model": "smollm2", "prompt": "Once upon a time", "stream": True,
        "max_tokens": 2000, "ignore_eos": True, "temperature": 0}),
        headers={"content-type": "application/json"})
    sock = conn.sock
    try:
        resp = conn.getresponse()
        first = resp.readline().decode()
        check(resp.status == 200 and first.startswith("data:"),
              "HTTP stream is running (%s, %r)" % (resp.status, first))
        short = pb.GenerateRequest(prompt="Hello", sampling=greedy(2))
        messages, err = generate(stub, short)
        trailers = dict(err.trailing_metadata() or ()) if err else {}
        check(err is not None and
              err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and
              not messages,
              "gRPC Generate while HTTP holds the slot -> RESOURCE_EXHAUSTED "
              "(%s: %s)" % (err and err.code(), err and err.details()))
        check("grpc-retry-pushback-ms" in trailers,
              "RESOURCE_EXHAUSTED carries grpc-retry-pushback-ms (%s)" %
              trailers)
    finally:
        # Hang up: the server stops the stream and frees the slot.
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()
    t0 = time.time()
    last = None
    while time.time() - t0 < 30:
        messages, err = generate(stub, short)
        if err is None and finished_of(messages) is not None:
            break
        last = err
        time.sleep(0.2)
    else:
        check(False, "the slot is free again within 30 s of the HTTP client "
              "hanging up (last: %s: %s)" %
              (last and last.code(), last and last.details()))
        return
    check(True, "the slot is free again %.1f s after the HTTP client hung "
          "up" % (time.time() - t0))


def check_tokenization(stub, http_port):
    prompt = "<|im_start|>user\nHi<|im_end|>\n"
    messages, err = generate(stub, pb.GenerateRequest(
        prompt=prompt, sampling=greedy(1)))
    fin = finished_of(messages)
    check(err is None and fin is not None,
          "raw prompt over gRPC (%s)" % (err and err.details()))
    status, _, body = http_request(http_port, "POST", "/v1/completions", {
        "model": "smollm2", "prompt": prompt, "max_tokens": 1,
        "temperature": 0})
    check(status == 200, "raw prompt over HTTP: %s %s" % (status, body[:200]))
    if fin is None or status != 200:
        return
    grpc_n = fin.usage.prompt_tokens
    http_n = json.loads(body)["usage"]["prompt_tokens"]
    check(grpc_n == http_n,
          "one tokenization rule: gRPC prompt_tokens %d == HTTP %d" %
          (grpc_n, http_n))
    check(0 < grpc_n <= 8,
          "special tokens in a raw prompt parse as single tokens (%d "
          "prompt tokens)" % grpc_n)


def check_usage(stub):
    s = stub.CreateSession(pb.CreateSessionRequest(session_id="g1"),
                           timeout=10)
    check(s.session_id == "g1" and s.turns == 0,
          "CreateSession g1 (%s turns)" % s.turns)
    turns = []
    for i in range(2):
        messages, err = generate(stub, pb.GenerateRequest(
            session_id="g1",
            messages=[pb.ChatMessage(role="user", content="Hi")],
            sampling=greedy(4)))
        fin = finished_of(messages)
        kinds = [m.WhichOneof("event") for m in messages]
        check(err is None and fin is not None and kinds[0] == "started" and
              messages[0].started.request_id != "",
              "session turn %d: started, deltas, finished (%s; %s)" %
              (i + 1, kinds[:1] + kinds[-1:], err and err.details()))
        if fin is None:
            return
        streamed = [t for m in messages if m.WhichOneof("event") == "delta"
                    for t in m.delta.token_ids]
        check(streamed == list(fin.token_ids) and
              len(streamed) == fin.usage.completion_tokens > 0,
              "session turn %d: the deltas' tokens are finished.token_ids "
              "(%d tokens)" % (i + 1, len(streamed)))
        turns.append(fin)
    a, b = turns
    # The second turn's context: everything stored after turn 1 plus its new
    # tokens (what the session grew by, less the reply).
    new_tokens = b.session_tokens - a.session_tokens - b.usage.completion_tokens
    check(b.usage.prompt_tokens == a.session_tokens + new_tokens,
          "turn 2 prompt_tokens is the whole context: %d == %d stored + %d "
          "new" % (b.usage.prompt_tokens, a.session_tokens, new_tokens))
    check(a.usage.cached_tokens == 0,
          "turn 1 cached_tokens == 0 (%d)" % a.usage.cached_tokens)
    check(b.usage.cached_tokens > 0,
          "turn 2 cached_tokens > 0 (%d of %d)" %
          (b.usage.cached_tokens, b.usage.prompt_tokens))
    check(a.turn == 1 and b.turn == 2,
          "turns committed: %d, %d" % (a.turn, b.turn))


def check_metrics(http_port):
    status, _, body = http_request(http_port, "GET", "/metrics")
    lines = [l for l in body.splitlines()
             if l.startswith("kvd_grpc_requests_total{") and
             'method="/kvd.v1.Sessions/Generate"' in l]
    check(status == 200 and lines,
          "/metrics counts gRPC Generate calls: %s" % lines)


if __name__ == "__main__":
    main()
