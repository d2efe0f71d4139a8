"""Hosts on a network for cluster tests: each host is a Linux network
namespace with one address on a bridge the test makes, so a test can cut any
link between two hosts, in either direction, with iptables inside the
namespaces (no tc netem here: links are up or cut).

    with Network() as net:
        a, b = net.add_host("a"), net.add_host("b")
        p = subprocess.Popen(a.wrap(["etcd", ...]))
        net.cut(a, b)            # both directions
        net.cut(a, b, both=False)  # a's packets to b dropped, b's to a pass
        net.heal()               # every cut removed

The test's own process stays in the root namespace and reaches every host
through the bridge (the bridge holds the subnet's .1), like a client outside
the cluster. Everything is removed on exit, pass or fail; namespaces and
bridges a killed test left behind (named after its dead pid) are removed by
the next Network.

Needs root, iproute2 and iptables (tools/setup.sh --test installs them).
"""

import atexit
import ipaddress
import os
import random
import re
import subprocess

PREFIX = "kvdh"  # namespaces: kvdh-PID-HOST; bridges: kvdbPID

# ip and iptables live in /usr/sbin, which Bazel's test PATH leaves out.
for _d in ("/usr/sbin", "/sbin"):
    if _d not in os.environ.get("PATH", "").split(":"):
        os.environ["PATH"] = os.environ.get("PATH", "") + ":" + _d


def _run(*args, check=True):
    r = subprocess.run(list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(args),
                                                   r.returncode, r.stdout))
    return r.stdout


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sweep_stale():
    """Removes namespaces and bridges of Networks whose process is gone."""
    for line in _run("ip", "netns", "list", check=False).splitlines():
        m = re.match(r"(%s-(\d+)-\S+)" % PREFIX, line)
        if m and not _alive(int(m.group(2))):
            _run("ip", "netns", "del", m.group(1), check=False)
    for line in _run("ip", "-o", "link", "show", "type", "bridge",
                     check=False).splitlines():
        m = re.search(r"\d+: (kvdb(\d+))[:@]", line)
        if m and not _alive(int(m.group(2))):
            _run("ip", "link", "del", m.group(1), check=False)


def check_available():
    """None if this machine can make namespaces and cut links, else why
    not (and what to do)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if subprocess.run(["sh", "-c", "command -v " + tool],
                          stdout=subprocess.DEVNULL).returncode != 0:
            return "%s is missing; run tools/setup.sh --test" % tool
    return None


class Host:
    def __init__(self, net, name, index):
        self.net, self.name = net, name
        self.ns = "%s-%d-%s" % (PREFIX, os.getpid(), name)
        self.address = str(net.subnet.network_address + index)
        self._veth = "kv%dh%d" % (os.getpid(), index)
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self._veth, "type", "veth", "peer", "name",
             "eth0", "netns", self.ns)
        _run("ip", "link", "set", self._veth, "master", net.bridge, "up")
        self.ip("addr", "add", "%s/%d" % (self.address, net.subnet.prefixlen),
                "dev", "eth0")
        self.ip("link", "set", "eth0", "up")
        self.ip("link", "set", "lo", "up")

    def ip(self, *args):
        return _run("ip", "-n", self.ns, *args)

    def iptables(self, *args):
        return _run("ip", "netns", "exec", self.ns, "iptables", "-w", *args)

    def wrap(self, argv):
        """argv run inside this host (its only address: self.address)."""
        return ["ip", "netns", "exec", self.ns] + list(argv)

    def __repr__(self):
        return "%s(%s)" % (self.name, self.address)


class Network:
    def __init__(self):
        reason = check_available()
        if reason:
            raise RuntimeError("cannot make hosts: " + reason)
        sweep_stale()
        self.bridge = "kvdb%d" % os.getpid()
        self.subnet = self._free_subnet()
        self.hosts = []
        self.cuts = set()  # (from, to) host names whose packets are dropped
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        atexit.register(self.close)
        _run("ip", "addr", "add", "%s/%d" % (self.subnet.network_address + 1,
                                             self.subnet.prefixlen),
             "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    @staticmethod
    def _free_subnet():
        """A /24 in 10.200.0.0/13 no route here uses yet (tests in parallel
        each get their own)."""
        used = [ipaddress.ip_network(m, strict=False) for m in re.findall(
            r"(\d+\.\d+\.\d+\.\d+/\d+)", _run("ip", "-4", "addr", "show"))]
        rng = random.Random(os.getpid())
        for _ in range(200):
            net = ipaddress.ip_network("10.%d.%d.0/24" % (
                200 + rng.randrange(8), rng.randrange(256)))
            if not any(net.overlaps(u) for u in used):
                return net
        raise RuntimeError("no free 10.200.0.0/13 subnet for the test hosts")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def add_host(self, name):
        h = Host(self, name, len(self.hosts) + 2)  # .1 is the bridge
        self.hosts.append(h)
        return h

    def cut(self, a, b, both=True):
        """Drops a's packets to b (and b's to a unless both=False). Dropped
        at the sender's OUTPUT, so b never sees them; TCP connections
        already open stall rather than reset, as in a real partition."""
        pairs = [(a, b), (b, a)] if both else [(a, b)]
        for x, y in pairs:
            if (x.name, y.name) in self.cuts:
                continue
            x.iptables("-A", "OUTPUT", "-d", y.address, "-j", "DROP")
            self.cuts.add((x.name, y.name))

    def isolate(self, group, rest):
        """Cuts every host of `group` from every host of `rest`, both ways."""
        for a in group:
            for b in rest:
                self.cut(a, b)

    def heal(self):
        for h in self.hosts:
            h.iptables("-F", "OUTPUT")
        self.cuts.clear()

    def close(self):
        for h in self.hosts:
            _run("ip", "netns", "del", h.ns, check=False)
        self.hosts = []
        _run("ip", "link", "del", self.bridge, check=False)
