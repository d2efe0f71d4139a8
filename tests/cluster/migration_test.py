#!/usr/bin/env python3
"""Sessions move between the nodes of a real cluster while users talk:
etcd, three `kvd serve --cluster` nodes of
SmolLM2 moving sessions over UCX (TCP here; shared memory is covered by
//services/migration:migration_test), one router, all over TLS.

  - USERS users hold multi-turn conversations through the router (greedy),
    half of them over its OpenAI HTTP API, half over its gRPC API;
  - meanwhile sessions are moved again and again to random other nodes
    (POST /v1/sessions/ID/migrate through the router), MIGRATIONS in all;
  - halfway, `kvd cluster drain n1` empties n1 while the users go on;
  - every turn succeeds (a turn that meets a move waits and runs on the
    target), no session is left on n1, and every reply is identical to a
    replay of the same turns on one standalone node that never moved
    anything: 0 token differences;
  - moving a session to a node that does not exist, or to its own node,
    fails cleanly and the session goes on where it was;
  - every session piled onto one node is spread out again by the nodes'
    rebalancing (idle sessions only), none losing a turn.

Prints the pause (freeze to the directory naming the target) and total
time of the moves, p50 and p99.

  bazel test //tests/cluster:migration_test
"""

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "e2e"))
from cluster_harness import (Cluster, Process, check, finish, http,  # noqa: E402
                             scratch_dir, wait_until)

USERS = int(os.environ.get("KVD_MIGRATION_USERS", "8"))
TURNS = int(os.environ.get("KVD_MIGRATION_TURNS", "6"))
MIGRATIONS = int(os.environ.get("KVD_MIGRATION_COUNT", "100"))


def turn_text(user, turn):
    topics = ["rivers", "bridges", "owls", "tea", "maps", "bells", "kites",
              "clocks"]
    return "Turn %d: tell me one thing about %s." % (
        turn, topics[(user + turn) % len(topics)])


def chat(url, session, text):
    body = {"model": "smollm2", "temperature": 0, "max_tokens": 12,
            "session_id": session,
            "messages": [{"role": "user", "content": text}]}
    return http("POST", url + "/v1/chat/completions", body)


def reply(body):
    return (body["choices"][0]["message"]["content"],
            body["usage"]["completion_tokens"])


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else 0


def grpc_chat(router, tmp):
    """chat() over the router's gRPC API: send(session, text) -> (reply,
    None) or (None, error). The stubs are compiled from sessions.proto."""
    import grpc
    import grpc_client_test as g  # its stub generation (tests/e2e)
    g.generate_stubs(tempfile.mkdtemp(dir=tmp))
    stub = g.pb_grpc.SessionsStub(
        grpc.insecure_channel("127.0.0.1:%d" % router.grpc_port))

    def send(session, text):
        messages, error = g.generate(stub, g.pb.GenerateRequest(
            session_id=session, sampling=g.greedy(12),
            messages=[g.pb.ChatMessage(role="user", content=text)]),
            timeout=300)
        finished = g.finished_of(messages)
        if error is not None or finished is None:
            return None, "gRPC %s" % (error or "stream without finished")
        return (finished.text, finished.usage.completion_tokens), None
    return send


def converse(router, user, replies, errors, progress, grpc_send=None):
    session = "user-%02d" % user
    for t in range(TURNS):
        if grpc_send is not None:
            got, error = grpc_send(session, turn_text(user, t))
        else:
            status, _, body = chat(router.url, session, turn_text(user, t))
            got, error = (reply(body), None) if status == 200 else (
                None, "%s %s" % (status, body))
        if error is not None:
            errors.append("%s turn %d: %s" % (session, t, error))
            return
        replies[session].append(got)
        progress[0] += 1


def mover(c, router, stop, reports, refusals):
    rng = random.Random(7)
    ids = [n.id for n in c.nodes]
    while not stop.is_set() and len(reports) < MIGRATIONS:
        directory = c.directory()
        if not directory:
            time.sleep(0.05)
            continue
        session = rng.choice(sorted(directory))
        owner = directory[session]["owner"]
        drains = c.etcd_range("/kvd/v1/drain/") or {}
        targets = [i for i in ids if i != owner and
                   "/kvd/v1/drain/" + i not in drains]
        if not targets:
            time.sleep(0.05)
            continue
        status, _, body = http(
            "POST", router.url + "/v1/sessions/%s/migrate" % session,
            {"to": rng.choice(targets)})
        if status == 200:
            reports.append(body)
        else:
            # A move can lose a race (the session moved, or is being moved
            # by the drain): refused, and the session stays whole.
            refusals.append((status, str(body)[:160]))


def owned_per_node(c):
    counts = {n.id: 0 for n in c.nodes}
    for e in c.directory().values():
        counts[e["owner"]] = counts.get(e["owner"], 0) + 1
    return counts


def rebalancing(c, kvd, router):
    """Every session piled onto n2: the nodes spread them out again, idle
    sessions only, and none loses a turn."""
    subprocess.run([kvd, "cluster", "--etcd", c.etcd_endpoint, "undrain",
                    "n1"], check=True, stdout=subprocess.DEVNULL)
    for session, e in sorted(c.directory().items()):
        if e["owner"] != "n2":
            http("POST", router.url + "/v1/sessions/%s/migrate" % session,
                 {"to": "n2"})
    piled = owned_per_node(c)
    total = sum(piled.values())

    def spread():
        counts = owned_per_node(c)
        mean = total / float(len(counts))
        return max(counts.values()) <= 1.5 * mean + 1
    try:
        wait_until("rebalancing", spread, 90)
    except AssertionError:
        pass
    counts = owned_per_node(c)
    turns = {}
    for s in c.directory():
        status, _, body = router.get("/v1/sessions/" + s)
        turns[s] = body.get("turns") if status == 200 else status
    ok = piled.get("n2", 0) >= total - 2 and spread()
    if not ok:
        for n in c.nodes:
            lines = [l for l in n.process.log_text().splitlines()
                     if "rebalanc" in l]
            print("---- %s: %s" % (n.id, "\n".join(lines[-8:])), flush=True)
    # (rebalancing may already have started while they were piled up)
    check(ok and
          all(isinstance(t, int) and t > 0 for t in turns.values()),
          "rebalancing spread %d sessions piled on n2 (%s) to %s, every one "
          "intact" % (total, piled, counts))


def reference_replies(kvd, tmp, turns=None):
    """The same turns, one user after another, on one standalone node:
    TURNS per user, or turns[session] where given."""
    p = Process("reference", [
        kvd, "serve", "--model", "smollm2", "--http-port", "0",
        "--grpc-port", "-1", "--threads", "1",
        "--data-dir", os.path.join(tmp, "reference")],
        os.path.join(tmp, "reference.log"))
    try:
        url = p.url_from_log()
        out = {}
        for user in range(USERS):
            session = "user-%02d" % user
            out[session] = []
            for t in range(TURNS if turns is None else turns[session]):
                status, _, body = chat(url, session, turn_text(user, t))
                if status != 200:
                    raise AssertionError("reference turn failed: %s %s" %
                                         (status, body))
                out[session].append(reply(body))
        return out
    finally:
        p.stop()


def main():
    import test_pyenv  # the gRPC users' packages
    test_pyenv.require(["grpc", "grpc_tools"], "migration_test")
    kvd = os.path.abspath(sys.argv[1])
    make_certs = os.path.abspath(sys.argv[2])
    tmp = scratch_dir()
    start = time.time()
    with Cluster(kvd, tmp, ttl=5, make_certs=make_certs,
                 node_flags=["--ucx-tls", "tcp", "--rebalance-every", "2"]) as c:
        # The test moves sessions as fast as it can: no per-tenant limit
        # on migrations at the router.
        router = c.start_nodes_and_router(
            router_args=["--tenant-migrations-per-minute", "0"])
        print("cluster up in %.1f s" % (time.time() - start), flush=True)

        # Moves that cannot happen are refused; nothing is lost.
        status, headers, _ = chat(router.url, "probe", "hello")
        owner = headers.get("X-Kvd-Node")
        bad = http("POST", router.url + "/v1/sessions/probe/migrate",
                   {"to": "no-such-node"})[0]
        same = http("POST", router.url + "/v1/sessions/probe/migrate",
                    {"to": owner})[0]
        again = chat(router.url, "probe", "still there?")
        check(status == 200 and bad == 404 and same == 400 and
              again[0] == 200 and again[1].get("X-Kvd-Node") == owner,
              "a move to an unknown node (%s) or to the owner itself (%s) "
              "is refused; the session goes on where it was" % (bad, same))

        replies = {"user-%02d" % u: [] for u in range(USERS)}
        errors, reports, refusals, progress = [], [], [], [0]
        stop = threading.Event()
        # Odd users talk gRPC: a turn that meets a move is resent by the
        # router's gRPC front end as by its HTTP one.
        grpc_send = grpc_chat(router, tmp)
        users = [threading.Thread(target=converse,
                                  args=(router, u, replies, errors, progress,
                                        grpc_send if u % 2 else None))
                 for u in range(USERS)]
        move = threading.Thread(target=mover,
                                args=(c, router, stop, reports, refusals))
        t0 = time.time()
        for t in users:
            t.start()
        move.start()
        # Halfway through the conversations, drain n1 while they go on.
        wait_until("half the turns", lambda: progress[0] >= USERS * TURNS // 2
                   or errors, 600)
        drained = subprocess.run(
            [kvd, "cluster", "--etcd", c.etcd_endpoint, "drain", "n1",
             "--wait", "300"], capture_output=True, text=True)
        print(drained.stdout.strip(), flush=True)
        for t in users:
            t.join()
        # Keep moving idle sessions until MIGRATIONS moves happened.
        move.join(timeout=max(0, 240 - (time.time() - t0)))
        stop.set()
        move.join()
        elapsed = time.time() - t0

        check(not errors, "every turn of %d users x %d turns (HTTP and gRPC) "
              "succeeded%s" % (USERS, TURNS, "" if not errors else
                               ": " + "; ".join(errors[:3])))
        check(drained.returncode == 0 and "is empty" in drained.stdout,
              "kvd cluster drain n1 emptied it while users talked (%s)" %
              (drained.stdout.strip().splitlines()[-1:] or drained.stderr))
        owners = {s: e["owner"] for s, e in c.directory().items()}
        check("n1" not in owners.values(),
              "the directory gives n1 no session after the drain")
        check(len(reports) >= MIGRATIONS,
              "%d migrations under load (%d refused by races, none lost) in "
              "%.0f s" % (len(reports), len(refusals), elapsed))
        if reports:
            wait = [r["freeze_wait_ms"] for r in reports]
            pause = [r["pause_ms"] for r in reports]
            total = [r["total_ms"] for r in reports]
            print("migration: waiting for the running turn ms p50 %.1f p99 "
                  "%.1f; pause (frozen until the target owns it) ms p50 %.1f "
                  "p99 %.1f; total ms p50 %.1f p99 %.1f; mean %.0f bytes on "
                  "the wire; transport %s" % (
                      percentile(wait, 50), percentile(wait, 99),
                      percentile(pause, 50), percentile(pause, 99),
                      percentile(total, 50), percentile(total, 99),
                      sum(r["wire_bytes"] for r in reports) / len(reports),
                      reports[0]["transport"]), flush=True)
            check(all(r["restore_path"] == "residuals" for r in reports),
                  "every target resumed from the residuals it received")
        log = "".join(n.process.log_text() for n in c.nodes)
        check("stale copy" not in log,
              "every source deleted its copy after the move")
        rebalancing(c, kvd, router)

    want = reference_replies(kvd, tmp)
    diffs = [(s, i) for s in want for i in range(TURNS)
             if i >= len(replies[s]) or replies[s][i] != want[s][i]]
    check(not diffs, "every reply is identical to a single-node replay of "
          "the same turns: %d differences%s" % (
              len(diffs), "" if not diffs else " (first: %s turn %d: %r vs "
              "%r)" % (diffs[0][0], diffs[0][1],
                       (replies[diffs[0][0]] + [None] * TURNS)[diffs[0][1]],
                       want[diffs[0][0]][diffs[0][1]])))
    print("done in %.1f s" % (time.time() - start))
    finish()


if __name__ == "__main__":
    main()
