#!/usr/bin/env python3
"""Crash loop: `kvd chat` is killed with SIGKILL at random points during turns, many times.

A driver runs a fixed 10-turn conversation (SmolLM2, greedy) in a `kvd chat --jsonl` process,
kills it with SIGKILL after a random delay, starts a new one that continues from whatever the
store holds, and repeats until the conversation is complete. After every kill it checks:
  - every acknowledged turn (a JSON line printed after its commit) is in the store;
  - at most one unacknowledged turn is (committed, killed before printing), never half of one:
    the store holds whole turns, and exporting the session (which decodes and CRC-checks every
    chunk) succeeds;
  - every turn's generated tokens equal those of one uninterrupted reference run.
Recovery time (the restore reported by the first turn after each restart) is printed.

usage: session_crash_loop_test.py KVD [KILLS]   (KILLS defaults to 50; the CI size)
"""
import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KVD = sys.argv[1]
KILLS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
# Removed at exit: the sandboxes here keep TEST_TMPDIR after a test ends.
TMP = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
atexit.register(shutil.rmtree, TMP, True)
MESSAGES = [f"Tell me one fact about the number {i}." for i in range(10)]
COMMON = ["--model", "smollm2", "--temperature", "0", "--max-tokens", "16", "--threads", "2",
          "--jsonl"]
failures = []


def chat(data_dir, session, messages, kill_after=None):
    """Runs one process; returns (JSON lines printed, killed?)."""
    proc = subprocess.Popen([KVD, "chat", *COMMON, "--data-dir", data_dir, "--session", session,
                             *messages],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            killed = True
    out, err = proc.communicate()
    if not killed and proc.returncode != 0:
        failures.append(f"kvd chat exited {proc.returncode}: {err}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], killed


def stored_turns(data_dir, session):
    r = subprocess.run([KVD, "sessions", "show", session, "--data-dir", data_dir],
                       capture_output=True, text=True)
    if r.returncode != 0:
        if "NOT_FOUND" in r.stderr:
            return 0
        failures.append(f"sessions show failed: {r.stderr}")
        return -1
    return len(json.loads(r.stdout).get("turn_ends", []))


def export_ok(data_dir, session):
    path = os.path.join(TMP, "crash.kvds")
    r = subprocess.run([KVD, "sessions", "export", session, path, "--data-dir", data_dir],
                       capture_output=True, text=True)
    return r.returncode == 0 or "NOT_FOUND" in r.stderr, r.stderr


def main():
    ref_dir = os.path.join(TMP, "reference")
    reference, _ = chat(ref_dir, "ref", MESSAGES)
    ref_tokens = {line["turn"]: line["tokens"] for line in reference}
    if len(ref_tokens) != len(MESSAGES):
        print("FAIL: reference run did not complete:", failures)
        return 1
    # Kill points spread over model loading, prefill, decoding and the commit: up to the
    # time one process takes to load and run two turns.
    full = time.time()
    chat(os.path.join(TMP, "timing"), "t", MESSAGES[:2])
    per_run = time.time() - full
    started = time.time()
    rng = random.Random(20261130)
    data = os.path.join(TMP, "crash")
    kills = 0
    recoveries = []
    rounds = 0
    # The same conversation in a fresh session per round, until enough kills happened.
    while kills < KILLS and not failures:
        session = f"crash{rounds}"
        rounds += 1
        acked = 0
        while not failures:
            have = stored_turns(data, session)
            if have < 0:
                break
            if have < acked or have > acked + 1:
                failures.append(f"{session} after kill {kills}: store holds {have} turns, "
                                f"{acked} acknowledged")
                break
            acked = have
            if have == len(MESSAGES):
                break
            ok, err = export_ok(data, session)
            if not ok:
                failures.append(f"{session} after kill {kills}: session does not load: {err}")
                break
            kill_after = rng.uniform(0.05, per_run) if kills < KILLS else None
            lines, killed = chat(data, session, MESSAGES[have:], kill_after)
            kills += killed
            for i, line in enumerate(lines):
                if line["tokens"] != ref_tokens.get(line["turn"]):
                    failures.append(f"{session} turn {line['turn']} differs from the reference")
                if i == 0 and line["path"] != "new":
                    recoveries.append((line["path"], line["restore_seconds"]))
            if lines:
                acked = max(acked, lines[-1]["turn"])
    elapsed = time.time() - started
    paths = {}
    for p, _ in recoveries:
        paths[p] = paths.get(p, 0) + 1
    times = sorted(t for _, t in recoveries) or [0]
    print(f"{kills} kills over {rounds} conversations in {elapsed:.0f} s; resumes by path: {paths}; restore time "
          f"median {times[len(times) // 2] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


sys.exit(main())
