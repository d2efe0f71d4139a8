#!/usr/bin/env python3
"""A node dies and its sessions live on:
etcd, three `kvd serve --cluster --replicas 2 --replication sync` nodes of
SmolLM2 (UCX over TCP, TLS) and one router.

  - USERS users talk through the router; every session gets one replica
    (the directory lists it) holding every acknowledged turn;
  - the node owning the most sessions is killed with SIGKILL mid-run;
  - within its lease TTL plus a controller pass, each of its sessions moves
    to its replica at epoch 2 (failover time printed);
  - every user's conversation goes on (a turn that finds the owner down gets
    503 + Retry-After and is retried, as a client would): no acknowledged
    turn is lost (each session holds all its turns) and every reply is
    identical to a replay of the same turns on one standalone node;
  - the killed node restarts with its old data: it serves none of the
    sessions that moved (their epoch went on without it).

  bazel test //tests/cluster:failover_test
"""

import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import (REPLICATED_NODE_FLAGS, Cluster,  # noqa: E402
                             check, finish, http, scratch_dir, wait_until)
import migration_test as mt  # noqa: E402  (turn texts, chat, the replay)

USERS = int(os.environ.get("KVD_FAILOVER_USERS", "6"))
TURNS = int(os.environ.get("KVD_FAILOVER_TURNS", "6"))


def converse(router, user, first, last, replies, errors, waits):
    session = "user-%02d" % user
    for t in range(first, last):
        start = time.time()
        if t == first:
            waits[session] = 0.0
        while True:
            status, headers, body = mt.chat(router.url, session,
                                            mt.turn_text(user, t))
            if status == 200:
                break
            if status != 503 or time.time() - start > 120:
                errors.append("%s turn %d: %s %s" % (session, t, status,
                                                     str(body)[:200]))
                return
            time.sleep(float(headers.get("Retry-After", "1")) / 4)
        if t == first:
            waits[session] = time.time() - start
        replies[session].append(mt.reply(body))


def main():
    kvd = os.path.abspath(sys.argv[1])
    make_certs = os.path.abspath(sys.argv[2])
    tmp = scratch_dir()
    mt.USERS, mt.TURNS = USERS, TURNS
    start = time.time()
    replies = {"user-%02d" % u: [] for u in range(USERS)}
    with Cluster(kvd, tmp, ttl=3, make_certs=make_certs,
                 node_flags=REPLICATED_NODE_FLAGS) as c:
        router = c.start_nodes_and_router()
        print("cluster up in %.1f s" % (time.time() - start), flush=True)

        errors, waits = [], {}
        half = TURNS // 2
        users = [threading.Thread(target=converse, args=(
            router, u, 0, half, replies, errors, waits)) for u in range(USERS)]
        for t in users:
            t.start()
        for t in users:
            t.join()
        directory = c.directory()
        check(not errors and all(len(e["replicas"]) == 1 and
                                 e["replicas"][0] != e["owner"]
                                 for e in directory.values()),
              "after %d turns every session has one replica on another node "
              "(%s)" % (half, errors[:2] or
                        sorted((s, e["owner"], e["replicas"])
                               for s, e in directory.items())))
        owned = {}
        for s, e in directory.items():
            owned.setdefault(e["owner"], []).append(s)
        victim_id = max(owned, key=lambda n: len(owned[n]))
        victim = [n for n in c.nodes if n.id == victim_id][0]
        moved = owned[victim_id]
        killed = time.time()
        victim.process.stop(signal.SIGKILL)
        # The users go on at once: a victim's session is unavailable until
        # its failover, then its turn runs on the replica.
        waits.clear()
        users = [threading.Thread(target=converse, args=(
            router, u, half, TURNS, replies, errors, waits))
            for u in range(USERS)]
        for t in users:
            t.start()

        def failed_over():
            d = c.directory()
            return all(d[s]["owner"] != victim_id for s in moved)
        wait_until("failover of %s's sessions" % victim_id, failed_over, 60)
        failover_s = time.time() - killed
        d = c.directory()
        check(all(d[s]["epoch"] == directory[s]["epoch"] + 1 and
                  d[s]["owner"] == directory[s]["replicas"][0]
                  for s in moved),
              "SIGKILL of %s: its %d sessions moved to their replicas at the "
              "next epoch in %.1f s (lease TTL 3 s)" % (
                  victim_id, len(moved), failover_s))

        for t in users:
            t.join()
        check(not errors, "every user's conversation went on after the kill%s"
              % ("" if not errors else ": " + "; ".join(errors[:3])))
        hit = sorted(waits[s] for s in moved if s in waits)
        if hit:
            print("unavailability of the killed node's sessions (kill to "
                  "their next reply): p50 %.1f s, max %.1f s; failover %.1f "
                  "s" % (hit[len(hit) // 2], hit[-1], failover_s), flush=True)
        turns = {}
        for u in range(USERS):
            status, _, body = router.get("/v1/sessions/user-%02d" % u)
            turns[u] = body.get("turns") if status == 200 else (status, body)
        check(all(t == TURNS for t in turns.values()),
              "no acknowledged turn was lost: every session holds all %d "
              "turns (%s)" % (TURNS, turns))

        # The nodes' own books agree.
        def metric(node, name):
            text = http("GET", node.url + "/metrics")[2]
            return sum(float(v) for v in re.findall(
                r"^%s(?:\{[^}]*\})? ([0-9.e+]+)$" % re.escape(name), text,
                re.M))
        live = [n for n in c.nodes if n.id != victim_id]
        promoted = sum(metric(n, "kvd_failover_promotions_total")
                       for n in live)
        updates = sum(metric(n, 'kvd_replication_total{kind="update"}')
                      for n in live)
        check(promoted == len(moved) and updates > 0,
              "/metrics: %d failover promotions, %d replicated updates" % (
                  promoted, updates))

        # The killed node comes back with its old data: the sessions that
        # moved are not served there any more.
        victim.process.start()
        victim.url = victim.process.url_from_log()
        wait_until("%s back" % victim_id, lambda: victim_id in c.live_nodes(),
                   60)
        body = {"model": "smollm2", "session_id": moved[0], "max_tokens": 4,
                "messages": [{"role": "user", "content": "stale?"}]}
        status = victim.direct("POST", "/v1/chat/completions", body)[0]
        check(status == 409, "the restarted node refuses a session that "
              "failed over (%s)" % status)

    want = mt.reference_replies(kvd, tmp)
    diffs = [(s, i) for s in want for i in range(TURNS)
             if i >= len(replies[s]) or replies[s][i] != want[s][i]]
    check(not diffs, "every reply, before and after the failover, is "
          "identical to a single-node replay: %d differences" % len(diffs))
    print("done in %.1f s" % (time.time() - start))
    finish()


if __name__ == "__main__":
    main()
