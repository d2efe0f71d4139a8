"""Real kvd clusters on loopback for tests: etcd (Debian's etcd-server) and
`kvd serve --cluster` / `kvd router` processes on ports the OS picks, each
test starting and stopping its own. No doubles: everything is the shipped
binary and etcd itself.

    with Cluster(kvd_binary, tmp_dir) as c:
        c.start_etcd()
        n1 = c.start_node("n1")
        r = c.start_router()
    # or, for the usual 3 nodes and a router, all ready:
    #   r = c.start_nodes_and_router()
        status, headers, body = r.chat("s1", "Hello")
"""

import atexit
import base64
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = "test-router-token"
# Nodes keeping two copies of every session, a turn acknowledged only once
# both hold it; no rebalancing, so sessions stay where the checks expect.
REPLICATED_NODE_FLAGS = ["--ucx-tls", "tcp", "--replicas", "2",
                         "--replication", "sync", "--rebalance-every", "0"]
# The cluster CA (tools/cluster/make_certs.sh) that https:// nodes are
# verified against; set by Cluster.
SSL_CONTEXT = None


def scratch_dir():
    """A fresh directory under TEST_TMPDIR, removed when the test exits, pass
    or fail. The sandboxes here keep TEST_TMPDIR after a test ends, and a
    cluster test writes gigabytes of checkpoints: left behind, they fill the
    disk the next runs (CI's included) need."""
    path = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    atexit.register(shutil.rmtree, path, True)
    return path


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(method, url, body=None, headers=None, timeout=120, context=None):
    """(status, headers, parsed JSON or text) of one request; never raises
    for an HTTP error status. `context`: the TLS context to use instead of
    the harness's (SSL_CONTEXT: the cluster CA and router:harness)."""
    data = None if body is None else (
        body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout,
                                    context=context or SSL_CONTEXT) as resp:
            status, hdrs, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout,
            ssl.SSLError) as e:
        # (Under TLS 1.3 a refused client certificate shows as an alert on
        # the first read, after the handshake seemed done.)
        return 0, {}, str(e)
    text = raw.decode(errors="replace")
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def wait_until(what, pred, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


class Process:
    def __init__(self, name, args, log_path, env=None):
        self.name, self.args, self.log_path = name, args, log_path
        self.env = env
        self.proc = None
        self.start()

    def start(self):
        self.log = open(self.log_path, "ab")
        self.log_offset = self.log.tell()  # url_from_log reads past it
        self.proc = subprocess.Popen(self.args, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=self.env)

    def log_text(self, since_start=False):
        with open(self.log_path, "rb") as f:
            if since_start:
                f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def url_from_log(self, limit=120):
        found = []

        def seen():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited:\n%s" % (self.name,
                                                         self.log_text()))
            m = re.findall(r"OpenAI API\s+(https?://127\.0\.0\.1:\d+)",
                           self.log_text(since_start=True))
            if m:
                found.append(m[-1])
            return bool(m)
        wait_until(self.name + " to listen", seen, limit)
        return found[0]

    def send(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Node:
    def __init__(self, cluster, node_id, model, ttl):
        self.id, self.model = node_id, model
        env = dict(os.environ, KVD_ROUTER_TOKEN=TOKEN)
        self.process = Process(node_id, [
            cluster.kvd, "serve", "--cluster", cluster.etcd_endpoint,
            "--node-id", node_id, "--lease-ttl", str(ttl), "--model", model,
            "--http-port", "0", "--grpc-port", "0", "--threads", "1",
            "--data-dir", os.path.join(cluster.dir, node_id)] +
            cluster.tls_args("node", node_id) + cluster.node_flags,
            os.path.join(cluster.dir, node_id + ".log"), env)
        self.url = self.process.url_from_log()

    def direct(self, method, path, body=None, tenant="local", token=TOKEN,
               context=None):
        """A request straight to the node, as a router would send it
        (`context`: another TLS identity than the harness's router one)."""
        headers = {"X-Kvd-Tenant": tenant}
        if token:
            headers["Authorization"] = "Bearer " + token
        return http(method, self.url + path, body, headers, context=context)

    def committed_turns(self):
        _, _, text = http("GET", self.url + "/metrics")
        m = re.search(r'kvd_turns_total\{outcome="committed"\} (\d+)', text)
        if not m:
            raise AssertionError("node %s has no committed-turns metric: %r" %
                                 (self.id, text[:200]))
        return int(m.group(1))


class Router:
    def __init__(self, cluster, port=0, extra_args=None):
        self.cluster = cluster
        self.port = port
        self.extra_args = list(extra_args or [])
        self.process = None
        cluster.router_count += 1
        self.tls = cluster.tls_args("router", "r%d" % cluster.router_count)
        self.start()

    def start(self):
        env = dict(os.environ, KVD_ROUTER_TOKEN=TOKEN)
        self.process = Process("router", [
            self.cluster.kvd, "router", "--etcd", self.cluster.etcd_endpoint,
            "--port", str(self.port), "--grpc-port", "0", "--threads", "32"] +
            self.tls + self.extra_args,
            os.path.join(self.cluster.dir, "router-%d.log" % id(self)), env)
        self.url = self.process.url_from_log()
        self.port = int(self.url.rsplit(":", 1)[1])
        m = re.findall(r"gRPC\s+127\.0\.0\.1:(\d+)",
                       self.process.log_text(since_start=True))
        self.grpc_port = int(m[-1]) if m else None

    def chat(self, session, text, model="smollm2", max_tokens=4, extra=None):
        body = {"model": model, "temperature": 0, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": text}]}
        if session:
            body["session_id"] = session
        body.update(extra or {})
        return http("POST", self.url + "/v1/chat/completions", body)

    def get(self, path):
        return http("GET", self.url + path)


class Cluster:
    """`make_certs`: tools/cluster/make_certs.sh; given, the cluster runs
    mutual TLS under a fresh cluster CA: each node serves HTTPS and gRPC
    with a certificate naming it (node:ID) and each router presents one
    naming it (router:rN). The harness's own requests present router:harness
    (Node.direct sends what a router would)."""

    def __init__(self, kvd, directory, ttl=3, make_certs=None,
                 node_flags=None):
        global SSL_CONTEXT
        self.kvd, self.dir, self.ttl = kvd, directory, ttl
        self.node_flags = list(node_flags or [])
        self.etcd = None
        self.nodes, self.routers = [], []
        self.etcd_endpoint = None
        self.make_certs = make_certs
        self.certs = os.path.join(directory, "certs")
        self.router_count = 0
        if make_certs:
            self.tls_args("router", "harness")
            SSL_CONTEXT = ssl.create_default_context(
                cafile=os.path.join(self.certs, "ca.pem"))
            SSL_CONTEXT.load_cert_chain(
                os.path.join(self.certs, "router-harness.pem"),
                os.path.join(self.certs, "router-harness.key"))

    def tls_args(self, role, identity):
        """Issues `role`:`identity` a certificate of the cluster CA (once)
        and returns the flags that give it to kvd; [] without TLS."""
        if not self.make_certs:
            return []
        cert = os.path.join(self.certs, "%s-%s.pem" % (role, identity))
        if not os.path.exists(cert):
            subprocess.run([self.make_certs, self.certs, "--" + role,
                            identity], check=True, stdout=subprocess.DEVNULL)
        return ["--tls-cert", cert, "--tls-key", cert[:-4] + ".key",
                "--ca-cert", os.path.join(self.certs, "ca.pem")]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for r in self.routers:
            r.process.stop()
        for n in self.nodes:
            n.process.send(signal.SIGCONT)
            n.process.stop()
        if self.etcd:
            self.etcd.stop()

    def start_etcd(self):
        client, peer = free_port(), free_port()
        self.etcd_endpoint = "127.0.0.1:%d" % client
        self._etcd_args = [
            "etcd", "--name", "kvd", "--data-dir",
            os.path.join(self.dir, "etcd"),
            "--listen-client-urls", "http://" + self.etcd_endpoint,
            "--advertise-client-urls", "http://" + self.etcd_endpoint,
            "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
            "--initial-cluster", "kvd=http://127.0.0.1:%d" % peer]
        self.etcd = Process("etcd", self._etcd_args,
                            os.path.join(self.dir, "etcd.log"))
        wait_until("etcd", lambda: self.etcd_range("/kvd/") is not None, 30)

    def restart_etcd(self, down_seconds=1.0):
        self.etcd.stop()
        time.sleep(down_seconds)
        self.etcd.start()
        wait_until("etcd back", lambda: self.etcd_range("/kvd/") is not None,
                   30)

    def start_node(self, node_id, model="smollm2"):
        n = Node(self, node_id, model, self.ttl)
        self.nodes.append(n)
        return n

    def start_router(self, extra_args=None):
        r = Router(self, extra_args=extra_args)
        self.routers.append(r)
        return r

    def start_nodes_and_router(self, nodes=3, router_args=None):
        """etcd, nodes n1..nN of SmolLM2 and one router (with
        `router_args`), waited for until every node is live and the router
        ready; returns the router."""
        self.start_etcd()
        for i in range(1, nodes + 1):
            self.start_node("n%d" % i)
        router = self.start_router(router_args)
        wait_until("%d live nodes" % nodes,
                   lambda: len(self.live_nodes()) == nodes, 60)
        wait_until("the router", lambda: router.get("/readyz")[0] == 200, 30)
        return router

    # etcd's own JSON gateway (v3), for checks independent of kvd's client.
    def _gateway(self, path, body):
        status, _, out = http("POST", "http://%s/v3/%s" % (
            self.etcd_endpoint, path), body, timeout=5)
        return out if status == 200 else None

    def etcd_range(self, prefix):
        """{key: value} under prefix, or None if etcd does not answer."""
        b64 = lambda s: base64.b64encode(s.encode()).decode()
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        out = self._gateway("kv/range", {"key": b64(prefix),
                                         "range_end": b64(end)})
        if out is None:
            return None
        return {base64.b64decode(kv["key"]).decode():
                base64.b64decode(kv.get("value", "")).decode()
                for kv in out.get("kvs", [])}

    def etcd_put(self, key, value):
        b64 = lambda s: base64.b64encode(s.encode()).decode()
        return self._gateway("kv/put", {"key": b64(key), "value": b64(value)})

    def live_nodes(self):
        kvs = self.etcd_range("/kvd/v1/nodes/") or {}
        return sorted(k.rsplit("/", 1)[1] for k in kvs)

    def directory(self, tenant="local"):
        kvs = self.etcd_range("/kvd/v1/sessions/%s/" % tenant) or {}
        return {k.rsplit("/", 1)[1]: json.loads(v) for k, v in kvs.items()}


# A test's checks: each prints ok/FAIL; finish() exits 1 if any failed.
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def finish():
    if FAILURES:
        print("%d FAILED:\n  %s" % (len(FAILURES), "\n  ".join(FAILURES)))
        raise SystemExit(1)
