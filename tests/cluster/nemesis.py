#!/usr/bin/env python3
"""A nemesis and a checker for a kvd cluster on hosts (Jepsen's shape).

The cluster: a 3-member etcd, nodes and a router, each on its own host (a
network namespace: tests/cluster/netns.py), nodes keeping 2 copies of every
session with synchronous replication, their data on a small tmpfs each.
Users hold conversations through the router while the nemesis runs a
schedule of faults drawn from a seed (printed; the same seed gives the same
schedule): partitions (a node from etcd, a node from its peers, the router
from a node, one etcd member from the others, every etcd member from every
other), pauses (SIGSTOP), kill -9 and restart, a data directory wiped before
the restart, a full disk, an etcd member killed and restarted.

Every request is recorded with its id and outcome: ok, failed (the server
said no) or unknown (no answer). A client resends a turn with the same
X-Request-Id until it learns the outcome, as a careful client does; one that
cannot learn it within TURN_GIVE_UP seconds abandons the session.

The checker then reads each session's committed history from its owner's
data directory (token ids, `kvd sessions show --tokens`), replays every
session's acknowledged turns on one standalone node, and verifies: every
acknowledged turn is present once and in order, and nothing else is (the
stored token ids equal the replay's, bit for bit; an abandoned turn may be
there once or not at all); every acknowledged reply equals the replay's; each
replica's copy holds the same history. It reports how long sessions could
not commit, per fault kind.

    tools/cluster/nemesis.sh --seconds 1800 --seed 7
    bazel test //tests/cluster:nemesis_test   # CI: fixed seeds, 2 minutes
"""

import argparse
import collections
import concurrent.futures
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import (REPLICATED_NODE_FLAGS, TOKEN,  # noqa: E402
                             Process, http, scratch_dir, wait_until)
import cluster_harness  # noqa: E402
from migration_test import turn_text  # noqa: E402
from netns import Network  # noqa: E402

KINDS = ["partition-node-etcd", "partition-node-peers",
         "partition-router-node", "partition-etcd-minority",
         "partition-etcd-all", "pause", "kill", "wipe", "disk-full",
         "etcd-kill"]
TURN_GIVE_UP = 90.0  # seconds a client keeps resending one turn
ATTEMPT_TIMEOUT = 20.0  # seconds one request may take before it is unknown
# Each node's disk: a tmpfs, so RAM only as it fills.
TMPFS_MB = int(os.environ.get("KVD_NEMESIS_DISK_MB", "2048"))
# A user starts a new conversation after this many turns, as users do, so
# that long runs stay within the model's context and the disks.
TURNS_PER_SESSION = 24


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else None


def chat_body(session, text):
    return {"model": "smollm2", "temperature": 0, "max_tokens": 8,
            "session_id": session,
            "messages": [{"role": "user", "content": text}]}


def reply_of(body):
    return (body["choices"][0]["message"]["content"],
            body["usage"]["completion_tokens"])


# ---------------------------------------------------------------- cluster

class HostCluster:
    """etcd members e1..e3, nodes n1..nN and router r1, each on a host."""

    def __init__(self, kvd, make_certs, tmp, nodes=3, ttl=3):
        self.kvd, self.tmp, self.ttl = kvd, tmp, ttl
        self.net = Network()
        self.etcd_hosts = [self.net.add_host("e%d" % i) for i in (1, 2, 3)]
        self.node_hosts = [self.net.add_host("n%d" % i)
                           for i in range(1, nodes + 1)]
        self.router_host = self.net.add_host("r1")
        self.etcd_endpoint = ",".join("%s:2379" % h.address
                                      for h in self.etcd_hosts)
        # Mutual TLS: a certificate per node naming it (node:ID, for its
        # host's address) and one per router; the checker's own requests
        # present router:harness.
        certs = os.path.join(tmp, "certs")

        def issue(role, name, addresses):
            subprocess.run([make_certs, certs, "--" + role, name] + addresses,
                           check=True, stdout=subprocess.DEVNULL)
            return ["--tls-cert", os.path.join(certs, "%s-%s.pem" % (role, name)),
                    "--tls-key", os.path.join(certs, "%s-%s.key" % (role, name)),
                    "--ca-cert", os.path.join(certs, "ca.pem")]

        self.node_tls = {h.name: issue("node", h.name, [h.address])
                         for h in self.node_hosts}
        self.router_tls = issue("router", self.router_host.name,
                                [self.router_host.address])
        issue("router", "harness", ["127.0.0.1"])
        import ssl
        cluster_harness.SSL_CONTEXT = ssl.create_default_context(
            cafile=os.path.join(certs, "ca.pem"))
        cluster_harness.SSL_CONTEXT.load_cert_chain(
            os.path.join(certs, "router-harness.pem"),
            os.path.join(certs, "router-harness.key"))
        self.etcd = {}
        self.nodes = {}
        self.router = None
        self.mounts = []

    # etcd
    def _etcd_args(self, h):
        peers = ",".join("%s=http://%s:2380" % (e.name, e.address)
                         for e in self.etcd_hosts)
        return h.wrap([
            "etcd", "--name", h.name,
            "--data-dir", os.path.join(self.tmp, "etcd-" + h.name),
            "--listen-client-urls", "http://%s:2379" % h.address,
            "--advertise-client-urls", "http://%s:2379" % h.address,
            "--listen-peer-urls", "http://%s:2380" % h.address,
            "--initial-advertise-peer-urls", "http://%s:2380" % h.address,
            "--initial-cluster", peers, "--initial-cluster-state", "new",
            "--initial-cluster-token", "kvd-nemesis-%d" % os.getpid()])

    def start_etcd(self):
        for h in self.etcd_hosts:
            self.etcd[h.name] = Process(h.name, self._etcd_args(h),
                                        os.path.join(self.tmp,
                                                     h.name + ".log"))
        wait_until("etcd quorum", lambda: self.etcd_range("/kvd/") is not None,
                   60)

    def etcd_range(self, prefix):
        """{key: value} under prefix from any member with quorum, or None."""
        import base64
        b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        for h in self.etcd_hosts:
            status, _, out = http("POST", "http://%s:2379/v3/kv/range" %
                                  h.address, {"key": b64(prefix),
                                              "range_end": b64(end)},
                                  timeout=3)
            if status == 200 and isinstance(out, dict):
                return {base64.b64decode(kv["key"]).decode():
                        base64.b64decode(kv.get("value", "")).decode()
                        for kv in out.get("kvs", [])}
        return None

    def live_nodes(self):
        return sorted(k.rsplit("/", 1)[1] for k in
                      (self.etcd_range("/kvd/v1/nodes/") or {}))

    def directory(self):
        kvs = self.etcd_range("/kvd/v1/sessions/local/")
        if kvs is None:
            return None
        return {k.rsplit("/", 1)[1]: json.loads(v) for k, v in kvs.items()}

    # nodes
    def data_dir(self, name):
        return os.path.join(self.tmp, "disk-" + name)

    def _mount_disk(self, name):
        d = self.data_dir(name)
        os.makedirs(d, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % TMPFS_MB,
                        "tmpfs", d], check=True)
        self.mounts.append(d)

    def _node_args(self, h):
        return h.wrap([
            self.kvd, "serve", "--cluster", self.etcd_endpoint,
            "--node-id", h.name, "--lease-ttl", str(self.ttl),
            "--model", "smollm2", "--host", h.address, "--http-port", "8080",
            "--grpc-port", "7070", "--threads", "1",
            "--data-dir", os.path.join(self.data_dir(h.name), "kvd")] +
            self.node_tls[h.name] + REPLICATED_NODE_FLAGS)

    def start_node(self, h):
        env = dict(os.environ, KVD_ROUTER_TOKEN=TOKEN)
        p = self.nodes.get(h.name)
        if p is None:
            self._mount_disk(h.name)
            self.nodes[h.name] = Process(h.name, self._node_args(h),
                                         os.path.join(self.tmp,
                                                      h.name + ".log"), env)
        else:
            p.stop(signal.SIGKILL)
            p.start()

    def start_router(self):
        h = self.router_host
        env = dict(os.environ, KVD_ROUTER_TOKEN=TOKEN)
        self.router = Process("r1", h.wrap([
            self.kvd, "router", "--etcd", self.etcd_endpoint,
            "--host", h.address, "--port", "8000", "--grpc-port", "-1",
            "--threads", "32"] + self.router_tls),
            os.path.join(self.tmp, "r1.log"), env)
        self.router_url = "http://%s:8000" % h.address

    def start(self):
        self.start_etcd()
        for h in self.node_hosts:
            self.start_node(h)
        self.start_router()
        self.wait_healthy()

    def wait_healthy(self, limit=120):
        n = len(self.node_hosts)
        wait_until("%d live nodes" % n, lambda: len(self.live_nodes()) == n,
                   limit)
        wait_until("the router", lambda: http(
            "GET", self.router_url + "/readyz", timeout=3)[0] == 200, limit)

    def host(self, name):
        return next(h for h in self.net.hosts if h.name == name)

    def processes(self):
        return list(self.etcd.values()) + list(self.nodes.values()) + (
            [self.router] if self.router else [])

    def stop_processes(self):
        for p in self.processes():
            if p.proc.poll() is None:
                p.send(signal.SIGCONT)
        if self.router:
            self.router.stop()
        for p in self.nodes.values():
            p.stop()
        for p in self.etcd.values():
            p.stop()

    def stop(self):
        """Every process stopped, the disks and the hosts removed."""
        self.stop_processes()
        for d in self.mounts:
            subprocess.run(["umount", "-l", d], check=False)
        self.mounts = []
        self.net.close()


# ---------------------------------------------------------------- nemesis

def schedule(seed, seconds, kinds):
    """[(start_s, kind, target, duration_s)], a pure function of its
    arguments: one fault at a time, 2-5 s apart, each 3-10 s long."""
    rng = random.Random(seed)
    out, t = [], 5.0
    while True:
        t += rng.uniform(2, 5)
        kind = rng.choice(kinds)
        duration = rng.uniform(3, 10)
        if t + duration > seconds:
            return out
        target = {"partition-etcd-minority": "e%d" % rng.randint(1, 3),
                  "partition-etcd-all": "etcd",
                  "etcd-kill": "e%d" % rng.randint(1, 3)}.get(
                      kind, "n%d" % rng.randint(1, 3))
        out.append((round(t, 2), kind, target, round(duration, 2)))
        t += duration


class Nemesis:
    def __init__(self, cluster):
        self.c = cluster
        self.log = []  # {"kind", "target", "start", "end"} in wall seconds

    def inject(self, kind, target):
        c, net = self.c, self.c.net
        if kind == "partition-node-etcd":
            net.isolate([c.host(target)], c.etcd_hosts)
        elif kind == "partition-node-peers":
            net.isolate([c.host(target)],
                        [h for h in c.node_hosts if h.name != target])
        elif kind == "partition-router-node":
            net.isolate([c.router_host], [c.host(target)])
        elif kind == "partition-etcd-minority":
            net.isolate([c.host(target)],
                        [h for h in c.etcd_hosts if h.name != target])
        elif kind == "partition-etcd-all":
            for i, a in enumerate(c.etcd_hosts):
                net.isolate([a], c.etcd_hosts[i + 1:])
        elif kind == "pause":
            c.nodes[target].send(signal.SIGSTOP)
        elif kind in ("kill", "wipe"):
            c.nodes[target].proc.kill()
            c.nodes[target].proc.wait()
            if kind == "wipe":
                shutil.rmtree(os.path.join(c.data_dir(target), "kvd"), True)
        elif kind == "disk-full":
            # All but 1 MiB of the node's tmpfs taken.
            # The node writes meanwhile: leave a little more room on each
            # try until the ballast fits.
            d = c.data_dir(target)
            for margin_mb in (1, 8, 64):
                st = os.statvfs(d)
                free = st.f_bavail * st.f_frsize - (margin_mb << 20)
                if free <= 0 or subprocess.run(
                        ["fallocate", "-l", str(free),
                         os.path.join(d, "ballast")],
                        stderr=subprocess.DEVNULL).returncode == 0:
                    break
        elif kind == "etcd-kill":
            c.etcd[target].proc.kill()
            c.etcd[target].proc.wait()
        else:
            raise ValueError(kind)

    def heal(self, kind, target):
        c = self.c
        if kind.startswith("partition-"):
            c.net.heal()
        elif kind == "pause":
            c.nodes[target].send(signal.SIGCONT)
        elif kind in ("kill", "wipe"):
            c.start_node(c.host(target))
        elif kind == "disk-full":
            try:
                os.remove(os.path.join(c.data_dir(target), "ballast"))
            except FileNotFoundError:
                pass
        elif kind == "etcd-kill":
            c.etcd[target].start()

    def run(self, plan, t0, stop):
        for start, kind, target, duration in plan:
            if stop.wait(max(0, t0 + start - time.time())):
                return
            rec = {"kind": kind, "target": target, "start": time.time()}
            self.inject(kind, target)
            print("%6.1f s  %-24s %s for %.1f s" % (
                time.time() - t0, kind, target, duration), flush=True)
            stop.wait(duration)
            self.heal(kind, target)
            rec["end"] = time.time()
            self.log.append(rec)
            if stop.is_set():
                return


# ---------------------------------------------------------------- clients

class History:
    """Every attempt of every turn, and each session's logical turns."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts = []  # dicts, appended under lock
        self.sessions = collections.OrderedDict()  # session -> [turn dict]


def client(cluster, history, user, index, stop):
    """One user: conversations of TURNS_PER_SESSION turns, one after
    another, until `stop`; gives up (and stops) on a turn it cannot
    settle."""
    n = 0
    while not stop.is_set():
        if not conversation(cluster, history, "%s-c%d" % (user, n), index,
                            stop):
            return
        n += 1


def conversation(cluster, history, session, index, stop):
    """False if a turn was abandoned."""
    turns = []
    with history.lock:
        history.sessions[session] = turns
    t = 0
    while not stop.is_set() and t < TURNS_PER_SESSION:
        request_id = "%s-turn-%d" % (session, t)
        text = turn_text(index, t)
        turn = {"turn": t, "text": text, "request_id": request_id,
                "first_start": time.time(), "outcome": None, "reply": None}
        while True:
            start = time.time()
            status, _, body = http(
                "POST", cluster.router_url + "/v1/chat/completions",
                chat_body(session, text), {"X-Request-Id": request_id},
                timeout=ATTEMPT_TIMEOUT)
            end = time.time()
            if status == 200:
                outcome = "ok"
            elif status == 409 and "already committed" in str(body):
                outcome = "ok-already-committed"
            elif status == 0 or "may or may not have committed" in str(body):
                outcome = "unknown"  # no answer, or the router had none
            else:
                outcome = "failed"
            with history.lock:
                history.attempts.append({
                    "session": session, "turn": t, "request_id": request_id,
                    "start": start, "end": end, "status": status,
                    "outcome": outcome,
                    "error": None if status == 200 else str(body)[:300]})
            if outcome.startswith("ok"):
                turn["outcome"] = "ok"
                turn["reply"] = reply_of(body) if status == 200 else None
                turn["end"] = end
                break
            if end - turn["first_start"] > TURN_GIVE_UP:
                turn["outcome"] = "abandoned"
                turn["end"] = end
                break
            time.sleep(0.5)
        turns.append(turn)
        if turn["outcome"] == "abandoned":
            return False
        t += 1
        # Think time, so the load is a chat's, not a benchmark's.
        stop.wait(random.uniform(0.5, 2.0))
    return True


# ---------------------------------------------------------------- checker

def stored_history(kvd, data_dir, session):
    """(token_ids, turn_ends) of the session in a stopped node's data
    directory, or None if it holds no such session."""
    r = subprocess.run([kvd, "sessions", "show", session, "--tokens",
                        "--data-dir", data_dir], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return None
    m = json.loads(r.stdout)
    return m.get("token_ids", []), [int(x) for x in m.get("turn_ends", [])]


def replay(kvd, tmp, histories):
    """{session: (replies, token_ids, turn_ends)}: each session's given turn
    texts, in order, on one standalone node."""
    data = os.path.join(tmp, "reference")
    p = Process("reference", [
        kvd, "serve", "--model", "smollm2", "--http-port", "0",
        "--grpc-port", "-1", "--threads", "1", "--data-dir", data],
        os.path.join(tmp, "reference.log"))
    replies = {}

    def one(session):
        replies[session] = []
        for text in histories[session]:
            status, _, body = http("POST", url + "/v1/chat/completions",
                                   chat_body(session, text))
            if status != 200:
                raise AssertionError("reference turn failed: %s %s" %
                                     (status, body))
            replies[session].append(reply_of(body))

    try:
        url = p.url_from_log()
        # Sessions side by side: the node batches them, and a batch gives
        # each sequence the bits it gets alone (docs/ARCHITECTURE.md).
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for f in [pool.submit(one, s) for s in histories]:
                f.result()
    finally:
        p.stop()
    return {s: (replies[s],) + (stored_history(kvd, data, s) or ([], []))
            for s in histories}


def gather(cluster, history, kvd, tmp):
    """What the checker judges: {session: {"owner", "stored", "replicas"}}
    read from the stopped nodes' data directories (None where the owner
    holds no copy), and the single-node replay of the turns each session
    should hold."""
    directory = cluster.directory() or {}
    cluster.stop_processes()  # the disks stay until cluster.stop()
    copies, texts = {}, {}
    for session, turns in history.sessions.items():
        entry = directory.get(session)
        if entry is None:
            copies[session] = None
            continue
        read = lambda node: stored_history(  # noqa: E731
            kvd, os.path.join(cluster.data_dir(node), "kvd"), session)
        owner = entry.get("owner")
        copies[session] = {
            "owner": owner, "stored": read(owner),
            "replicas": {r: read(r) for r in entry.get("replicas", [])
                         if r != owner}}
        texts[session] = expected_texts(turns, copies[session]["stored"])
    return copies, replay(kvd, tmp, texts)


def expected_texts(turns, stored):
    """The turn texts a session should hold: the acknowledged ones, and an
    abandoned last turn if the store holds one turn more (it committed,
    once)."""
    want = [t["text"] for t in turns if t["outcome"] == "ok"]
    n = len(stored[1]) if stored else 0
    if turns and turns[-1]["outcome"] == "abandoned" and n == len(want) + 1:
        want.append(turns[-1]["text"])
    return want


def judge(history, copies, ref, faults):
    """The verdict: counts and lists of findings, printed by summarize()."""
    found = {"lost": [], "stranded": [], "duplicated": [], "divergent": [],
             "replica_divergent": []}
    for session, turns in history.sessions.items():
        acked = [t for t in turns if t["outcome"] == "ok"]
        copy = copies.get(session)
        if copy is None:
            if acked:
                found["lost"].append("%s: %d acknowledged turns, no "
                                     "directory entry" % (session, len(acked)))
            continue
        held = copy["stored"]
        if held is None or len(held[1]) < len(acked):
            # The owner lacks acknowledged turns: lost unless a replica
            # holds them (then the cluster cannot serve them: stranded).
            fuller = [(r, c) for r, c in copy["replicas"].items()
                      if c is not None and len(c[1]) >= len(acked)]
            if fuller:
                found["stranded"].append(
                    "%s: owner %s holds %s of %d acknowledged turns; "
                    "replica %s holds them" % (
                        session, copy["owner"],
                        "none" if held is None else len(held[1]),
                        len(acked), fuller[0][0]))
                held = fuller[0][1]
            elif held is None:
                if acked:
                    found["lost"].append(
                        "%s: %d acknowledged turns; no copy holds them" % (
                            session, len(acked)))
                continue
        tokens, ends = held
        want = expected_texts(turns, held)
        if len(ends) < len(acked):
            found["lost"].append("%s: %d turns stored, %d acknowledged" % (
                session, len(ends), len(acked)))
        elif len(ends) > len(want):
            found["duplicated"].append("%s: %d turns stored, %d sent" % (
                session, len(ends), len(want)))
        r_replies, r_tokens, r_ends = ref[session]
        if len(ends) == len(want) and len(r_ends) == len(want) and (
                tokens != r_tokens or ends != r_ends):
            first = next((i for i, (a, b) in enumerate(zip(tokens, r_tokens))
                          if a != b), min(len(tokens), len(r_tokens)))
            found["divergent"].append(
                "%s: the stored token ids differ from a single-node replay "
                "of its acknowledged turns from position %d" % (session,
                                                               first))
        for i, t in enumerate(acked):
            if t["reply"] is not None and i < len(r_replies) and \
                    t["reply"] != r_replies[i]:
                found["divergent"].append(
                    "%s turn %d: acknowledged reply %r, replay %r" % (
                        session, t["turn"], t["reply"], r_replies[i]))
        for replica, other in copy["replicas"].items():
            if other != copy["stored"]:
                found["replica_divergent"].append(
                    "%s: replica %s holds %s turns, owner %s %s" % (
                        session, replica,
                        "no" if other is None else len(other[1]),
                        copy["owner"], "none" if copy["stored"] is None else
                        len(copy["stored"][1])))
    found["acknowledged"] = sum(
        1 for turns in history.sessions.values() for t in turns
        if t["outcome"] == "ok")
    found["abandoned"] = sum(
        1 for turns in history.sessions.values()
        if turns and turns[-1]["outcome"] == "abandoned")
    found["sessions"] = len(history.sessions)
    found["unknown_attempts"] = sum(
        1 for a in history.attempts if a["outcome"] == "unknown")
    found["failed_attempts"] = sum(
        1 for a in history.attempts if a["outcome"] == "failed")
    found["unavailability"] = unavailability(history, faults)
    return found


def unavailability(history, faults):
    """{fault kind: [seconds]}: for each turn that could not commit at
    once (it took over 2 s or more than one attempt), how long it waited,
    filed under the fault active when it was first sent, else the last one
    healed within 10 s before ("none" if neither)."""
    out = collections.defaultdict(list)
    attempts = collections.Counter(
        (a["session"], a["turn"]) for a in history.attempts)
    for session, turns in history.sessions.items():
        for t in turns:
            begin = t["first_start"]
            waited = t.get("end", begin) - begin
            if waited <= 2.0 and attempts[(session, t["turn"])] <= 1:
                continue
            active = [f for f in faults if f["start"] <= begin < f["end"]]
            recent = [f for f in faults if begin - 10 < f["end"] <= begin]
            kind = (active[-1] if active else
                    max(recent, key=lambda f: f["end"]) if recent else
                    {"kind": "none"})["kind"]
            out[kind].append(waited)
    return dict(out)


def self_check(history, copies, ref, faults):
    """None if the checker, given this run's real data with one acknowledged
    turn hidden and one acknowledged reply altered, reports both; else what
    it missed. A checker that cannot fail proves nothing."""
    import copy as copy_module
    clean = judge(history, copies, ref, faults)
    flagged = " ".join(x for k in ("lost", "stranded", "duplicated",
                                   "divergent") for x in clean[k])
    sessions = [s for s, c in copies.items() if c and c["stored"] and
                s + ":" not in flagged and s + " " not in flagged and
                len([t for t in history.sessions[s] if t["outcome"] == "ok"])
                >= 2]
    if not sessions:
        return "no clean session with 2 acknowledged turns to tamper with"
    tampered = History()
    tampered.attempts = history.attempts
    tampered.sessions = copy_module.deepcopy(history.sessions)
    turns = tampered.sessions[sessions[0]]
    acked = [t for t in turns if t["outcome"] == "ok"]
    acked[-1]["outcome"] = "failed"  # the store holds a turn not acked
    acked[0]["reply"] = ("tampered", -1)
    found = judge(tampered, copies, ref, faults)
    missed = []
    if not any(sessions[0] in x for x in found["duplicated"]):
        missed.append("an extra stored turn")
    if not any(sessions[0] in x and "tampered" in x
               for x in found["divergent"]):
        missed.append("an altered reply")
    return "the checker missed " + " and ".join(missed) if missed else None


def summarize(found, faults, seconds):
    by_kind = collections.Counter(f["kind"] for f in faults)
    lines = ["faults injected: %d in %.0f s (%s)" % (
        len(faults), seconds, ", ".join("%s %d" % kv for kv in
                                        sorted(by_kind.items()))),
             "sessions %d, turns acknowledged %d, abandoned sessions %d, "
             "attempts failed %d, attempts with unknown outcome %d" % (
                 found["sessions"], found["acknowledged"], found["abandoned"],
                 found["failed_attempts"], found["unknown_attempts"]),
             "lost %d, duplicated %d, divergent %d; stranded (only a "
             "replica holds them) %d, replica copies that differ %d" % (
                 len(found["lost"]), len(found["duplicated"]),
                 len(found["divergent"]), len(found["stranded"]),
                 len(found["replica_divergent"]))]
    lines.append("turns that could not commit at once, by the fault active "
                 "when sent (count, p50 / p99 / max wait in s):")
    for kind, xs in sorted(found["unavailability"].items()):
        lines.append("  %-24s %4d  %5.1f / %5.1f / %5.1f" % (
            kind, len(xs), percentile(xs, 50), percentile(xs, 99), max(xs)))
    lines.append("checker self-check: %s" % (
        found.get("self_check") or "it reports a hidden turn and an altered "
        "reply"))
    for what in ("lost", "duplicated", "divergent", "stranded",
                 "replica_divergent"):
        for x in found[what][:10]:
            lines.append("  %s: %s" % (what, x))
    return "\n".join(lines)


def run(kvd, make_certs, seed, seconds, users, kinds, out_dir=None):
    """Runs one schedule; returns the checker's findings."""
    tmp = scratch_dir()
    plan = schedule(seed, seconds, kinds)
    print("seed %d, %d s, %d faults: %s" % (seed, seconds, len(plan), plan),
          flush=True)
    cluster = HostCluster(kvd, make_certs, tmp)
    history = History()
    nemesis = Nemesis(cluster)
    try:
        cluster.start()
        stop_clients, stop_nemesis = threading.Event(), threading.Event()
        threads = [threading.Thread(target=client, args=(
            cluster, history, "s%d-u%02d" % (seed, u), u, stop_clients))
            for u in range(users)]
        t0 = time.time()
        for th in threads:
            th.start()
        nem = threading.Thread(target=nemesis.run,
                               args=(plan, t0, stop_nemesis))
        nem.start()
        nem.join()
        # Healed: let the cluster settle, then let clients finish.
        try:
            cluster.wait_healthy(120)
        except AssertionError as e:
            print("after the schedule: %s" % e, flush=True)
        time.sleep(5)
        stop_clients.set()
        for th in threads:
            th.join()
        elapsed = time.time() - t0
        copies, ref = gather(cluster, history, kvd, tmp)
        found = judge(history, copies, ref, nemesis.log)
        found["self_check"] = self_check(history, copies, ref, nemesis.log)
    finally:
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "nemesis-%d.json" % seed),
                      "w") as f:
                json.dump({"seed": seed, "plan": plan,
                           "faults": nemesis.log,
                           "attempts": history.attempts,
                           "sessions": history.sessions}, f, indent=1)
            for p in cluster.processes():
                dst = os.path.join(out_dir, "seed%d-%s.log" % (seed, p.name))
                shutil.copy(p.log_path, dst)
        cluster.stop()
    print(summarize(found, nemesis.log, elapsed), flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "verdict-%d.json" % seed), "w") as f:
            json.dump(found, f, indent=1)
    return found


def failed(found):
    return bool(found["lost"] or found["duplicated"] or found["divergent"] or
                found.get("self_check"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kvd")
    ap.add_argument("make_certs")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, action="append")
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="comma-separated fault kinds (default: all)")
    ap.add_argument("--out", default=os.environ.get(
        "TEST_UNDECLARED_OUTPUTS_DIR"), help="history and logs go here")
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error("unknown fault kinds %s; known: %s" % (bad, KINDS))
    verdicts = [failed(run(os.path.abspath(a.kvd),
                           os.path.abspath(a.make_certs), seed, a.seconds,
                           a.users, kinds, a.out))
                for seed in (a.seed or [1])]
    sys.exit(1 if any(verdicts) else 0)


if __name__ == "__main__":
    main()
