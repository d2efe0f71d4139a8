#!/usr/bin/env python3
"""Chaos: etcd, three `kvd serve --cluster
--replicas 2 --replication sync` nodes of SmolLM2 (UCX over TCP, TLS), one
router; USERS users hold conversations for DURATION seconds while every
KILL_EVERY seconds a random node is killed with SIGKILL and restarted a few
seconds later, and once another node is stopped with SIGSTOP past its lease
and continued.

Checks: no acknowledged turn is lost and none is committed twice (each
session holds exactly its user's turns; the user resends with the same
X-Request-Id) and every acknowledged reply is identical to a replay of the
same turns on one standalone node. A turn that finds its
session's owner down gets 503 + Retry-After (or a connection error) and the
user retries it, as a client would; the test prints the unavailability per
kill.

  bazel test //tests/cluster:chaos_test                 # 2 minutes
  KVD_CHAOS_SECONDS=1200 bazel test //tests/cluster:chaos_test --test_timeout=3600
"""

import os
import random
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import (REPLICATED_NODE_FLAGS, Cluster,  # noqa: E402
                             check, finish, http, scratch_dir, wait_until)
import migration_test as mt  # noqa: E402

USERS = int(os.environ.get("KVD_CHAOS_USERS", "4"))
DURATION = float(os.environ.get("KVD_CHAOS_SECONDS", "120"))
KILL_EVERY = float(os.environ.get("KVD_CHAOS_KILL_EVERY", "30"))


def chat(url, session, text, request_id):
    body = {"model": "smollm2", "temperature": 0, "max_tokens": 12,
            "session_id": session,
            "messages": [{"role": "user", "content": text}]}
    return http("POST", url + "/v1/chat/completions", body,
                {"X-Request-Id": request_id})


def user(router, u, stop, acked, gaps, errors):
    """A careful client: it resends a failed turn with the same
    X-Request-Id, so a turn that committed before its answer was lost (the
    node died right after) is not committed twice: the resend gets 409
    "already committed", and the turn counts as acknowledged with its reply
    unknown (None)."""
    session = "user-%02d" % u
    t = 0
    while not stop.is_set():
        start = time.time()
        request_id = "%s-turn-%d" % (session, t)
        while True:
            status, headers, body = chat(router.url, session,
                                         mt.turn_text(u, t), request_id)
            if status == 200:
                reply = mt.reply(body)
                break
            if status == 409 and "already committed" in str(body):
                reply = None
                break
            if status not in (0, 503, 409) or time.time() - start > 90:
                errors.append("%s turn %d: %s %s" % (session, t, status,
                                                     str(body)[:200]))
                return
            # 503: the owner is down (failover comes); 0: the connection
            # broke; 409 without "already committed": refused before it
            # ran (the session moved under it). Resend.
            time.sleep(0.5)
        took = time.time() - start
        if took > 2.0:
            gaps.append(took)
        acked[session].append(reply)
        t += 1


def main():
    kvd = os.path.abspath(sys.argv[1])
    make_certs = os.path.abspath(sys.argv[2])
    tmp = scratch_dir()
    rng = random.Random(11)
    acked = {"user-%02d" % u: [] for u in range(USERS)}
    gaps, errors, kills, failovers = [], [], [], []
    with Cluster(kvd, tmp, ttl=3, make_certs=make_certs,
                 node_flags=REPLICATED_NODE_FLAGS) as c:
        router = c.start_nodes_and_router()
        stop = threading.Event()
        users = [threading.Thread(target=user, args=(
            router, u, stop, acked, gaps, errors)) for u in range(USERS)]
        for t in users:
            t.start()
        start = time.time()
        paused = False
        while time.time() - start < DURATION and not errors:
            time.sleep(KILL_EVERY / 2)
            if not paused:
                # Once: a node stopped past its lease, then continued.
                victim = rng.choice(c.nodes)
                victim.process.send(signal.SIGSTOP)
                time.sleep(6)
                victim.process.send(signal.SIGCONT)
                kills.append(("SIGSTOP", victim.id))
                paused = True
            time.sleep(KILL_EVERY / 2)
            victim = rng.choice(c.nodes)
            victim.process.stop(signal.SIGKILL)
            killed = time.time()
            kills.append(("SIGKILL", victim.id))
            # Failover: until the directory gives the dead node no session
            # (its sessions promoted to their replicas), at most the 5 s
            # before the node is restarted.
            while time.time() - killed < 5:
                owners = [e.get("owner") for e in c.directory().values()]
                if victim.id not in owners:
                    failovers.append(time.time() - killed)
                    break
                time.sleep(0.1)
            else:
                failovers.append(None)
            time.sleep(max(0, 5 - (time.time() - killed)))
            victim.process.start()
            victim.url = victim.process.url_from_log()
        stop.set()
        for t in users:
            t.join()
        print("faults: %s" % kills, flush=True)
        if errors:
            # What the processes said: the test's temporary files go away.
            for p in [r.process for r in c.routers] + [
                    n.process for n in c.nodes]:
                print("---- %s (exit %s), last lines:\n%s" % (
                    p.name, p.proc.poll(),
                    "\n".join(p.log_text().splitlines()[-15:])), flush=True)
        check(not errors, "every turn was answered in the end%s" % (
            "" if not errors else ": " + "; ".join(errors[:3])))
        total = sum(len(v) for v in acked.values())
        wait_until("3 live nodes again", lambda: len(c.live_nodes()) == 3, 60)
        held = {}
        for s in acked:
            status, _, body = router.get("/v1/sessions/" + s)
            held[s] = body.get("turns") if status == 200 else (status, body)
        check(all(held[s] == len(acked[s]) for s in acked),
              "no acknowledged turn lost: %d turns acknowledged, every "
              "session holds exactly its own (%s)" % (
                  total, {s: (len(acked[s]), held[s]) for s in acked}))
        done = sorted(f for f in failovers if f is not None)
        if failovers:
            print("failover after each SIGKILL (the dead node owns nothing "
                  "any more): %d of %d within 5 s; p50 %.1f s, max %.1f s" % (
                      len(done), len(failovers),
                      done[len(done) // 2] if done else -1,
                      done[-1] if done else -1), flush=True)
        gaps.sort()
        if gaps:
            print("turns that waited over 2 s: %d; p50 %.1f s, p99 %.1f s, "
                  "max %.1f s" % (len(gaps), gaps[len(gaps) // 2],
                                  gaps[min(len(gaps) - 1,
                                           int(0.99 * len(gaps)))],
                                  gaps[-1]), flush=True)
    turns = {s: len(v) for s, v in acked.items()}
    mt.USERS = USERS
    # The replay: each user's acknowledged turns, on one standalone node.
    replay = mt.reference_replies(kvd, tmp, turns)
    diffs = [(s, i) for s in acked for i in range(len(acked[s]))
             if acked[s][i] is not None and replay[s][i] != acked[s][i]]
    unknown = sum(1 for v in acked.values() for r in v if r is None)
    check(not diffs, "every acknowledged reply is identical to a "
          "single-node replay: %d differences (%d turns committed whose "
          "answer was lost to a kill, not committed twice)" % (
              len(diffs), unknown))
    finish()


if __name__ == "__main__":
    main()
