#!/usr/bin/env python3
"""Resume of a long session on CPU tensor-parallel shard processes vs one process.

For each TP degree: a `kvd serve` (TP > 1: `--tensor-parallel-size N --backend cpu`, this
process as shard 0 plus N-1 `kvd worker` processes) gets a session whose first message is about
TOKENS tokens, then is restarted on the same data directory; the first turn after each restart
resumes the session from its RocksDB checkpoint (KV-Direct: every shard recomputes its own
heads' K/V from the residual rows the leader streams to it). Reported per degree (medians over
REPEATS restarts):
  - end-to-end resume: the turn's wall time with max_tokens 1 (restore + the new message's
    prefill + one token), as a client sees it;
  - the leader's restore (session_restore_ms: reading the checkpoint + shard 0's recompute;
    the workers recompute alongside and the first step waits for them);
  - per shard worker, from /metrics: residual bytes received and recompute seconds;
  - the first message's prefill (the session's creation), for scale.
All shards share the machine's cores: on 2 cores, TP=3 runs three processes on two cores.

usage: tools/bench/tp_resume.py [--kvd KVD] [--tokens 4096] [--degrees 1,3] [--repeats 3]
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request


def cpu_family():
    fam = model = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("cpu family") and not fam:
            fam = line.split(":")[1].strip()
        if line.startswith("model name") and not model:
            model = line.split(":")[1].strip()
    return f"{model}, family {fam}, {os.cpu_count()} vCPU"


class Server:
    def __init__(self, kvd, data_dir, tp, log):
        args = [kvd, "serve", "--model", "smollm2", "--data-dir", data_dir, "--http-port", "0",
                "--grpc-port", "-1"]
        if tp > 1:
            args += ["--tensor-parallel-size", str(tp), "--backend", "cpu"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        self.port = None
        for _ in range(1200):
            m = re.search(r"http://127\.0\.0\.1:(\d+)", open(log).read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit(f"server did not start:\n{open(log).read()}")

    def chat(self, message):
        body = json.dumps({"model": "smollm2", "session_id": "long", "max_tokens": 1,
                           "temperature": 0,
                           "messages": [{"role": "user", "content": message}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=body, headers={"content-type": "application/json"})
        start = time.time()
        with urllib.request.urlopen(req, timeout=1200) as r:
            reply = json.load(r)
        return time.time() - start, reply

    def shard_metrics(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics").read().decode()
        out = {}
        for name in ("kvd_shard_residual_bytes_received_total",
                     "kvd_shard_recompute_seconds_total"):
            for rank, value in re.findall(name + r'\{rank="(\d+)"\} (\S+)', text):
                out.setdefault(int(rank), {})[name] = float(value)
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvd", default="bazel-bin/tools/kvd/kvd")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--degrees", default="1,3")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    kvd = os.path.abspath(args.kvd)
    tmp = tempfile.mkdtemp()
    # "wordN" is about 3 tokens with SmolLM2's tokenizer.
    first = " ".join(f"word{i % 97}" for i in range(args.tokens // 3))
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu_family()}, load {os.getloadavg()[0]:.2f}, "
          f"{platform.node()}")
    rows = []
    try:
        for tp in [int(d) for d in args.degrees.split(",")]:
            data = os.path.join(tmp, f"tp{tp}")
            server = Server(kvd, data, tp, os.path.join(tmp, f"create{tp}.log"))
            prefill_s, reply = server.chat(first)
            tokens = reply["usage"]["prompt_tokens"]
            server.stop()
            walls, restores, per_shard = [], [], []
            for r in range(args.repeats):
                server = Server(kvd, data, tp, os.path.join(tmp, f"resume{tp}-{r}.log"))
                wall, reply = server.chat(f"Now say word{r}.")
                walls.append(wall)
                restores.append(reply.get("session_restore_ms", 0) / 1000)
                state = reply.get("session_state")
                if state != "rocksdb":
                    print(f"note: TP={tp} resume {r} came from {state}")
                per_shard.append(server.shard_metrics())
                server.stop()
            rows.append((tp, tokens, prefill_s, statistics.median(walls),
                         statistics.median(restores), per_shard[-1]))
    finally:
        shutil.rmtree(tmp, True)
    print(f"\n{'TP':>3} {'session tokens':>14} {'create s':>9} {'resume e2e s':>13} "
          f"{'leader restore s':>17}  per worker: MiB received, recompute s")
    for tp, tokens, prefill_s, wall, restore, shards in rows:
        workers = "; ".join(
            f"rank {rank}: {m['kvd_shard_residual_bytes_received_total'] / 2**20:.0f} MiB, "
            f"{m['kvd_shard_recompute_seconds_total']:.2f} s"
            for rank, m in sorted(shards.items())) or "-"
        print(f"{tp:>3} {tokens:>14} {prefill_s:>9.2f} {wall:>13.2f} {restore:>17.2f}  {workers}")


if __name__ == "__main__":
    main()
