#!/usr/bin/env python3
"""`kvd serve --tensor-parallel-size 3 --backend cpu`, as a new user runs it, end to end.

The leader serves SmolLM2 (9 heads, 3 K/V heads) as shard 0 and starts two `kvd worker` shard
processes. One conversation (greedy, with logprobs) moves between TP degrees across restarts
on one data directory: turns 1-2 at TP=3, turn 3 at TP=1, turn 4 at TP=3 again (resumed from
its residual checkpoint, each shard recomputing its own heads' K/V). Every turn's text and
every token's logprob (the float's bits, printed to 17 digits) must equal those of one
uninterrupted TP=1 server. Then a shard worker is killed with SIGKILL in the middle of a turn:
that turn fails with 503 (or had finished), the leader restarts its workers, no committed turn
is lost, the retried conversation still matches the reference exactly, and a session that was
hot and idle at the time resumes from its checkpoint on its next turn without an error. Last, the leader is
killed with SIGKILL and its workers must exit on their own.

usage: tensor_parallel_serve_test.py KVD
"""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

KVD = sys.argv[1]
TMP = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
atexit.register(shutil.rmtree, TMP, True)
MESSAGES = ["What is the capital of France?", "And of Spain?",
            "Name a river in one of them.", "Say it again in one word."]
failures = []
servers = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, flush=True)


class Server:
    def __init__(self, data_dir, tp):
        self.log = os.path.join(TMP, f"serve-{len(servers)}.log")
        args = [KVD, "serve", "--model", "smollm2", "--data-dir", data_dir,
                "--http-port", "0", "--grpc-port", "-1", "--threads", "2"]
        if tp > 1:
            args += ["--tensor-parallel-size", str(tp), "--backend", "cpu"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"))
        servers.append(self)
        self.port, self.workers = None, []
        for _ in range(1200):
            text = open(self.log).read()
            m = re.search(r"http://127\.0\.0\.1:(\d+)", text)
            if m:
                self.port = int(m.group(1))
                w = re.search(r"'kvd worker' processes ([\d, ]+)", text)
                self.workers = [int(p) for p in w.group(1).split(",")] if w else []
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if self.port is None:
            raise SystemExit(f"FAIL: server did not start:\n{open(self.log).read()}")

    def chat(self, session, message, timeout=300):
        body = json.dumps({"model": "smollm2", "session_id": session, "max_tokens": 16,
                           "temperature": 0, "logprobs": True,
                           "messages": [{"role": "user", "content": message}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=body, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)


def turn_of(reply):
    """What must be identical: the text and every token's logprob, exactly."""
    choice = reply["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its dead parent's reaper) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid):
    """The processes whose parent is `pid` (the leader's shard workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().split(")")[-1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def wait_gone(pids, seconds):
    end = time.time() + seconds
    while time.time() < end and any(alive(p) for p in pids):
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


def main():
    # The reference: one uninterrupted single-process server.
    ref = Server(os.path.join(TMP, "ref"), 1)
    want = []
    for m in MESSAGES:
        status, reply = ref.chat("s", m)
        check(status == 200, f"reference turn: HTTP {status} {reply}")
        want.append(turn_of(reply))
    ref.stop()

    data = os.path.join(TMP, "moving")
    plan = [(3, [0, 1]), (1, [2]), (3, [3])]  # (TP degree, turns)
    for tp, turns in plan:
        server = Server(data, tp)
        check(len(server.workers) == tp - 1,
              f"TP={tp}: expected {tp - 1} workers, the notice says {server.workers}")
        for i in turns:
            status, reply = server.chat("s", MESSAGES[i])
            check(status == 200, f"TP={tp} turn {i + 1}: HTTP {status} {reply}")
            if status != 200:
                continue
            check(turn_of(reply) == want[i],
                  f"TP={tp} turn {i + 1} differs from the TP=1 reference:\n"
                  f"  got  {turn_of(reply)}\n  want {want[i]}")
            if i > 0 and i == turns[0]:
                # The first turn after a restart resumes from the checkpoint, not a re-prefill.
                check(reply.get("session_state") in ("dram", "rocksdb"),
                      f"TP={tp} turn {i + 1} was {reply.get('session_state')}, not a restore")
            print(f"TP={tp} turn {i + 1}: {reply.get('session_state')}, "
                  f"restore {reply.get('session_restore_ms', 0):.1f} ms: "
                  f"{turn_of(reply)[0]!r}", flush=True)
        if tp > 1 and turns[0] > 0:
            # The restore streamed residual rows to both workers, which recomputed from them.
            text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read()
            metrics = dict(re.findall(r'(kvd_shard_\w+\{rank="\d"\}) (\S+)', text.decode()))
            for rank in (1, 2):
                got = float(metrics.get(f'kvd_shard_residual_bytes_received_total{{rank="{rank}"}}',
                                        0))
                rows = float(metrics.get(f'kvd_shard_rows_recomputed_total{{rank="{rank}"}}', 0))
                print(f"rank {rank}: {got / 2**20:.1f} MiB of residuals, {rows:.0f} rows", flush=True)
                check(got > 0 and rows > 0, f"rank {rank} got no residuals to resume from: {metrics}")
        server.stop()
        check(wait_gone(server.workers, 30), f"TP={tp}: workers outlived their leader's stop")

    # A shard worker killed mid-turn.
    server = Server(os.path.join(TMP, "kill"), 3)
    for session in ("k", "idle"):
        status, reply = server.chat(session, MESSAGES[0])
        check(status == 200 and turn_of(reply) == want[0], f"before the kill: {status} {reply}")
    result = {}
    t = threading.Thread(target=lambda: result.update(r=server.chat("k", MESSAGES[1])))
    t.start()
    time.sleep(0.15)
    os.kill(server.workers[0], signal.SIGKILL)
    t.join()
    status, reply = result["r"]
    print(f"the turn a worker died in: HTTP {status}", flush=True)
    check(status in (200, 503), f"the interrupted turn: HTTP {status} {reply}")
    attempts = 0
    while status != 200 and attempts < 5:
        attempts += 1
        status, reply = server.chat("k", MESSAGES[1])
        print(f"retry {attempts}: HTTP {status}", flush=True)
    check(status == 200, f"the retried turn never succeeded: {status} {reply}")
    if status == 200:
        check(turn_of(reply) == want[1], f"after the kill, turn 2 differs:\n"
              f"  got  {turn_of(reply)}\n  want {want[1]}")
    # A session that was hot and idle when the worker died resumes from its checkpoint at once.
    status, reply = server.chat("idle", MESSAGES[1])
    check(status == 200, f"the idle session's next turn failed: {status} {reply}")
    if status == 200:
        check(turn_of(reply) == want[1] and reply.get("session_state") != "hot",
              f"the idle session after the restart: {reply.get('session_state')} "
              f"{turn_of(reply)}")
    status, reply = server.chat("k", MESSAGES[2])
    check(status == 200 and turn_of(reply) == want[2],
          f"turn 3 after the restart: {status} {turn_of(reply) if status == 200 else reply}")
    pids = children(server.proc.pid)
    check(len(pids) == 2, f"the leader runs {len(pids)} workers after the restart, not 2")
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    check(wait_gone(pids, 30), f"workers {pids} outlived their SIGKILLed leader")

    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
