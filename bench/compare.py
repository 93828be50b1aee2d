#!/usr/bin/env python3
"""Side-by-side benchmark of peerlb against HAProxy and nginx on loopback.

Run it through bench/compare.sh (which builds the release binary first).
Every contender forwards the same wrk load to the same three backends
(`peerlb app`, the built-in demo app alone over HTTP/1.1):

  direct     wrk straight to backend 1 (the limit)
  haproxy    HAProxy, HTTP mode, balance url_param user + hash-type consistent
  nginx      nginx, hash $arg_user consistent, keep-alive upstreams
  peerlb-3   3 peerlb nodes on one SO_REUSEPORT address, node i's app is
             upstream backend i (about 2/3 of requests cross a QUIC hop)
  peerlb-1   1 peerlb node, app upstream backend 1 (entry always owns)
  peerlb-3-builtin
             3 peerlb nodes on one SO_REUSEPORT address, each with the
             built-in app in process (no backend; its counterparts are
             haproxy and nginx, in front of three built-in backends)
  peerlb-hop 2 peerlb nodes with the built-in app, wrk to node 1 whose
             weight is 0, so every request crosses the hop to node 2: the
             hop-only figure (requests per CPU-second of an entry and an
             owner, no backends)
  peerlb-3-embedded
             3 nodes of examples/sharded_cache.rs (the key-value store
             embedded as each node's app: no backend) on one SO_REUSEPORT
             address; GET /kv/u<k> is routed by the key to its owner
  haproxy-kv HAProxy (balance uri, hash-type consistent) in front of
             three processes of the same store served alone with hyper
             (`sharded_cache --standalone`): peerlb-3-embedded's
             counterpart. Both are measured at 200-byte values (each key
             put once before the rounds) and only at the points of
             KV_POINTS (16 and 128 connections, moderate load); their
             system CPU is every process of theirs (no shared backends)
  hop-floor  the hop's floor (benches/hop_floor.rs, --floor): an entry
             serving HTTP/1.1 with hyper on one current_thread runtime,
             one quinn stream per request to an owner process that
             answers a fixed 200-byte body; nothing else. peerlb-hop's
             figures are read against it

Besides the balancer's CPU, each measurement gives the system CPU per
request: every process that serves the contender (HAProxy or nginx and
the three backends, peerlb-3 or peerlb-1 and the backends, the nodes of
peerlb-3-builtin and peerlb-hop alone, the floor's two processes), what
a user pays for the whole path.

Besides req/s, latency, CPU and RSS, each measurement counts the
balancer's context switches (voluntary + involuntary, every thread) and
its UDP sends (sendmsg/sendmmsg calls, counted by `perf stat` on the
syscall tracepoints; without perf, the machine's UDP datagrams from
/proc/net/snmp, which other programs move too) and all its system calls
(`perf stat` on raw_syscalls:sys_enter; none without perf), each per
request: figures that a loaded machine moves far less than req/s.

All contenders stay up for the whole run; each measurement resets the
balancer's peak RSS (/proc/PID/clear_refs 5), reads its CPU ticks from
/proc/PID/stat before and after, and runs wrk (keys uniform over 10,000
`user` values, keep-alive). Rounds alternate the contenders (the order
rotates every round) so drift on a shared machine spreads over all of them;
the tables give medians over rounds, and the ratios are medians of the
per-round ratios (each taken from measurements seconds apart).

With --https, HAProxy, nginx and every peerlb contender terminate TLS with
one generated certificate (ECDSA P-256; TLS 1.3 negotiated by wrk's
OpenSSL; ALPN offers h2 and http/1.1 at all three) and the clients speak
HTTPS to them (direct stays cleartext: the backend's limit). The points are
then the base and moderate-load points on keep-alive connections (one
handshake per connection: the cost of TLS records), a new-connection
point, where every request carries `Connection: close` so each costs a TCP
connection and a TLS handshake (whether wrk resumes sessions is up to its
OpenSSL client): handshakes per second, and an HTTP/2 point: h2load
(Debian's nghttp2-client) with 16 streams in flight on 4 connections
(ALPN h2), the same keys from a file; its latency percentiles come from
h2load's per-request log. direct is not measured at the HTTP/2 point (the
backend speaks HTTP/1.1 only), and the point is left out when h2load is
not installed.
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLK_TCK = os.sysconf("SC_CLK_TCK")

CONTENDERS = ["direct", "haproxy", "nginx", "peerlb-3", "peerlb-1", "peerlb-3-builtin", "peerlb-hop",
              "hop-floor", "peerlb-3-embedded", "haproxy-kv"]
# The key-value contenders (examples/sharded_cache.rs, --example): GET
# /kv/u<k> of 200-byte values, measured at these points only.
KV = ["peerlb-3-embedded", "haproxy-kv"]
KV_VALUE = 200
PEERLB = ["peerlb-3", "peerlb-1", "peerlb-3-builtin", "peerlb-hop"]
BEFORE = [c + "-before" for c in PEERLB]
# Nodes of each peerlb contender (peak RSS per node).
NODES = {"peerlb-3": 3, "peerlb-1": 1, "peerlb-3-builtin": 3, "peerlb-hop": 2}
# Contenders served by the three backends: their system CPU includes the
# backends' (the others serve in process).
ON_BACKENDS = {"direct", "haproxy", "nginx", "peerlb-3", "peerlb-1", "peerlb-3-before", "peerlb-1-before"}
# A point is (response bytes, connections, think time in ms per connection).
BASE = (200, 16, 0)  # saturation: the throughput ratios
MODERATE = (200, 16, 5)  # fixed moderate load (<= 3,200 req/s): added p99, CPU per request
# HTTPS only (a fourth element names the mode): a new connection (and TLS
# handshake) for every request, and HTTP/2 with h2load: 4 connections of
# H2_STREAMS streams each (the base point's 16 requests in flight).
NEW_CONN = (200, 16, 0, "close")
H2_STREAMS = 4
H2 = (200, 4, 0, "h2")
SIZES = [200, 16 * 1024, 1024 * 1024]
CONNS = [1, 16, 128]
C128 = (200, 128, 0)
KV_POINTS = [BASE, C128, MODERATE]
# Keys: `user` values u1..u<USERS>, uniform (bench/keys.lua has the same default).
USERS = 10000


def points(which):
    """The base point, the moderate-load point, then the size and concurrency
    sweeps; https: base, moderate load, a new connection per request, HTTP/2."""
    if which == "https":
        return [BASE, MODERATE, NEW_CONN] + ([H2] if shutil.which("h2load") else [])
    if which == "base":
        return [BASE, MODERATE]
    if which == "kv":
        return [BASE, C128]
    if which == "sizes":
        return [(s, BASE[1], 0) for s in SIZES]
    out = [BASE, MODERATE]
    for s in SIZES:
        if (s, BASE[1], 0) not in out:
            out.append((s, BASE[1], 0))
    for c in CONNS:
        if (BASE[0], c, 0) not in out:
            out.append((BASE[0], c, 0))
    return out


def point_label(pt):
    size, conns, think = pt[:3]
    if mode(pt) == "h2":
        return (f"{size_label(size)} responses, {conns * H2_STREAMS} streams on {conns} "
                f"HTTP/2 connections (h2load)")
    s = f"{size_label(size)} responses, {conns} connection{'s' if conns > 1 else ''}"
    if think:
        s += f", {think} ms think time (moderate load)"
    if mode(pt) == "close":
        s += ", a new connection per request"
    return s


def mode(pt):
    """None (keep-alive HTTP/1.1 with wrk), "close" or "h2"."""
    return pt[3] if len(pt) > 3 else None


def size_label(n):
    if n >= 1 << 20:
        return f"{n >> 20} MiB"
    if n >= 1 << 10:
        return f"{n >> 10} KiB"
    return f"{n} B"


# ---------------------------------------------------------------- /proc ----


def descendants(pid):
    """pid and all its descendants (nginx workers, ...)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def context_switches(pids):
    """Voluntary + involuntary context switches of every thread of pids."""
    total = 0
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/status") as f:
                    for line in f:
                        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                            total += int(line.split()[1])
            except OSError:
                pass
    return total


UDP_SENDS = "syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendmmsg"
SYSCALLS = "raw_syscalls:sys_enter"


class UdpSends:
    """Counts the sendmsg/sendmmsg calls and all system calls of pids while
    it runs, with `perf stat` on the syscall tracepoints (root, or
    perf_event_paranoid <= -1). The peerlb nodes send UDP (the QUIC hop,
    gossip) with sendmsg and TCP with write/writev, so the first is their
    UDP sends alone, whatever else runs on the machine. `stop` gives
    (sends, syscalls), each None when perf is missing or refuses."""

    def __init__(self, pids, path):
        self.path, self.proc = path, None
        if pids and shutil.which("perf"):
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x,", "-e", UDP_SENDS + "," + SYSCALLS, "-o", path,
                 "-p", ",".join(str(p) for p in pids)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            time.sleep(0.1)  # perf attaches before the load starts

    def stop(self):
        if not self.proc:
            return None, None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait()
        sends = calls = None
        try:
            with open(self.path) as f:
                for line in f:
                    parts = line.strip().split(",")
                    if len(parts) > 2 and parts[0].isdigit():
                        if parts[2] == SYSCALLS:
                            calls = (calls or 0) + int(parts[0])
                        elif parts[2].startswith("syscalls:"):
                            sends = (sends or 0) + int(parts[0])
        except OSError:
            return None, None
        return sends, calls


def udp_out_datagrams():
    """The machine's UDP datagrams sent so far (/proc/net/snmp, Udp OutDatagrams)."""
    with open("/proc/net/snmp") as f:
        lines = [l.split() for l in f if l.startswith("Udp:")]
    return int(lines[1][lines[0].index("OutDatagrams")])


def reset_peak_rss(pids):
    for p in pids:
        try:
            with open(f"/proc/{p}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_rss_kib(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


# ------------------------------------------------------------ processes ----


class Procs:
    """Processes this script started; stopped (by pid) on exit."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, argv, **kw):
        log = open(os.path.join(self.logdir, f"{name}.log"), "wb")
        p = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kw
        )
        self.procs.append((name, p))
        return p

    def stop_all(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        for _, p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def port_free(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no conflict
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def get(url, timeout=2):
    # The --https contenders serve a generated self-signed certificate.
    ctx = None
    if url.startswith("https://"):
        import ssl

        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
        return r.status, r.read()


def wait_ok(url, what, procs, timeout=30):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        for name, p in procs.procs:
            if p.poll() is not None:
                sys.exit(f"{name} exited (status {p.returncode}); see {procs.logdir}/{name}.log")
        try:
            st, _ = get(url)
            if st == 200:
                return
        except Exception as e:  # noqa: BLE001 - any failure means not ready yet
            last = e
        time.sleep(0.2)
    sys.exit(f"{what} not ready at {url}: {last}")


def wait_port(addr, what, procs, timeout=30):
    """Waits until addr ("ip:port") accepts a TCP connection."""
    host, port = addr.rsplit(":", 1)
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name, p in procs.procs:
            if p.poll() is not None:
                sys.exit(f"{name} exited (status {p.returncode}); see {procs.logdir}/{name}.log")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} not listening on {addr}")


def wait_serving(admin, n, procs, timeout=30, client=None):
    """Waits until the node's status lists n serving members. The status is
    read on the admin listener, or on the client port `client` (a --before
    binary older than the admin listener answers it there)."""
    import json

    deadline = time.time() + timeout
    while time.time() < deadline:
        for addr in [admin] + ([client] if client else []):
            try:
                _, body = get(f"http://{addr}/_peerlb/status")
                if len(json.loads(body).get("serving", [])) == n:
                    return
            except Exception:  # noqa: BLE001
                pass
        time.sleep(0.2)
    sys.exit(f"peerlb node (admin {admin}) does not see {n} serving members; logs in {procs.logdir}")


def peerlb_cluster(name, bin_, tmp, procs, base_port, nodes, backends, listen, weights=None,
                   tls=None, example=None):
    """Writes a cluster.toml, makes certificates, starts the nodes.

    backends None: every node serves with the built-in app in process.
    weights: each node's weight (default 100). Node i's ports: http
    base_port + i, peer + 10, gossip + 20, admin http + 1000 (the default).
    tls (cert, key): the client listeners serve HTTPS (the shared listener
    too: it takes [listener]'s settings). example: the sharded_cache
    example's binary: its nodes (the store embedded), routed by /kv/<key>.
    """
    lines = [
        f'name = "{name}"',
        'policy = "consistent-hash"',
        'app = "builtin"',
        "[tls]",
        f'dir = "{tmp}/certs-{name}"',
        "[limits]",
        "drain_grace_ms = 100",
    ]
    if tls:
        lines += ["[listener.tls]", f'cert = "{tls[0]}"', f'key = "{tls[1]}"']
    specs = []
    for i in range(nodes):
        http, peer, gossip = base_port + i, base_port + 10 + i, base_port + 20 + i
        specs.append((f"{name}n{i + 1}", http))
        lines += [
            "[[nodes]]",
            f'id = "{name}n{i + 1}"',
            f'http_addr = "127.0.0.1:{http}"',
            f'peer_addr = "127.0.0.1:{peer}"',
            f'gossip_addr = "127.0.0.1:{gossip}"',
        ]
        if weights:
            lines.append(f"weight = {weights[i]}")
    if example:
        lines += ["[[rules]]", 'name = "kv"', "extract = [{ path_regex = '^/kv/([^/]+)$' }]"]
    else:
        lines += ["[[rules]]", 'name = "user"', 'extract = [{ query = "user" }]']
    cfg = os.path.join(tmp, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(
        [bin_, "certs", "--config", cfg], check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    pids = []
    # The nodes run with their default log filter (what a user gets) unless
    # BENCH_RUST_LOG says otherwise.
    env = dict(os.environ)
    if os.environ.get("BENCH_RUST_LOG"):
        env["RUST_LOG"] = os.environ["BENCH_RUST_LOG"]
    for i, (nid, _) in enumerate(specs):
        argv = [example, cfg, nid] if example else [bin_, "node", "--config", cfg, "--node", nid]
        if backends:
            argv += ["--app", f"http://{backends[i % len(backends)]}"]
        if listen:
            argv += ["--shared-listen", listen]
        pids.append(procs.start(nid, argv, env=env).pid)
    for _, http in specs:
        wait_serving(f"127.0.0.1:{http + 1000}", nodes, procs, client=f"127.0.0.1:{http}")
    return pids


# Each peerlb contender's block of ports above --port-base: http +0..+2,
# peer +10.., gossip +20.., the shared client address +30, admin +1000..
# (the nodes' default). The -before variants take the block 160 higher.
LAYOUT = {
    # contender: (cluster name, port offset, nodes, on the backends, weights)
    "peerlb-3": ("p3", 30, 3, True, None),
    "peerlb-1": ("p1", 70, 1, True, None),
    "peerlb-3-builtin": ("i3", 110, 3, False, None),
    # Node 1 (the entry wrk talks to) owns no key: every request is forwarded.
    "peerlb-hop": ("h2", 150, 2, False, [0, 100]),
    # The key-value store embedded (examples/sharded_cache.rs).
    "peerlb-3-embedded": ("e3", 450, 3, False, None),
}
BEFORE_SHIFT = 160


def contender_ports(c, b):
    """Every port the contender c binds (to check they are free)."""
    if c == "haproxy":
        return [b + 10]
    if c == "nginx":
        return [b + 20]
    if c == "hop-floor":
        return [b + 400, b + 401]
    if c == "haproxy-kv":
        return [b + 12, b + 4, b + 5, b + 6]
    if c not in LAYOUT and not c.endswith("-before"):
        return []
    base = c[: -len("-before")] if c.endswith("-before") else c
    _, off, n, _, _ = LAYOUT[base]
    off += BEFORE_SHIFT if c.endswith("-before") else 0
    ports = [b + off + k * 10 + i for k in range(3) for i in range(n)]
    ports += [b + off + 1000 + i for i in range(n)]
    return ports + ([b + off + 30] if n > 1 else [])


def https_cert(tmp):
    """A self-signed ECDSA P-256 certificate for localhost and 127.0.0.1:
    (cert, key, cert+key PEM for HAProxy's crt)."""
    cert, key, both = (os.path.join(tmp, f) for f in ("bench.pem", "bench.key", "bench-haproxy.pem"))
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", key, "-out", cert],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with open(both, "w") as f:
        f.write(open(cert).read() + open(key).read())
    return cert, key, both


def start_peerlb(c, args, tmp, procs, backends, tls):
    """Starts the peerlb contender c (HTTPS with tls); returns (url, pids)."""
    b = args.port_base
    before = c.endswith("-before")
    base = c[: -len("-before")] if before else c
    name, off, n, on_backends, weights = LAYOUT[base]
    off += BEFORE_SHIFT if before else 0
    bin_ = args.before if before else args.bin
    shared = f"127.0.0.1:{b + off + 30}" if n > 1 and base != "peerlb-hop" else None
    example = args.example if base in KV else None
    pids = peerlb_cluster(name + ("b" if before else ""), bin_, tmp, procs, b + off, n,
                          backends if on_backends else None, shared, weights, tls[:2] if tls else None,
                          example)
    url = f"{'https' if tls else 'http'}://{shared or f'127.0.0.1:{b + off}'}"
    if example:
        kv_fill(url, c)
    else:
        wait_ok(f"{url}/bytes/200?user=x", c, procs)
    return url, pids


def kv_fill(url, what):
    """PUTs a KV_VALUE-byte value for each key u1..u<USERS> through url (one
    keep-alive connection), then checks one GET."""
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    value = b"v" * KV_VALUE
    for k in range(1, USERS + 1):
        conn.request("PUT", f"/kv/u{k}", body=value)
        r = conn.getresponse()
        r.read()
        if r.status != 204:
            sys.exit(f"{what}: PUT /kv/u{k} answered {r.status}")
    conn.request("GET", "/kv/u1")
    r = conn.getresponse()
    if r.status != 200 or r.read() != value:
        sys.exit(f"{what}: GET /kv/u1 does not give the value put")
    conn.close()


def start_all(args, tmp, procs, contenders):
    """Starts backends and contenders; returns {contender: (url, pids)} and backend pids."""
    b = args.port_base
    tls = https_cert(tmp) if args.https else None
    scheme = "https" if tls else "http"
    backends = [f"127.0.0.1:{b + 1 + i}" for i in range(3)]
    want = [b + 1, b + 2, b + 3] + [p for c in contenders for p in contender_ports(c, b)]
    busy = [p for p in want if not port_free(p)]
    if busy:
        sys.exit(f"ports in use: {busy} (choose another --port-base)")
    env = dict(os.environ, RUST_LOG="warn")
    app_pids = []
    for i, a in enumerate(backends):
        app_pids.append(
            procs.start(f"app{i + 1}", [args.bin, "app", "--listen", a, "--name", f"app{i + 1}"],
                        env=env).pid
        )
    for a in backends:
        wait_ok(f"http://{a}/bytes/200", "backend", procs)

    out = {"direct": (f"http://{backends[0]}", [])}

    if "haproxy" in contenders:
        hp = b + 10
        with open(os.path.join(HERE, "haproxy.cfg.in")) as f:
            cfg = f.read().format(
                dir=tmp,
                listen=f"127.0.0.1:{hp}" + (f" ssl crt {tls[2]} alpn h2,http/1.1" if tls else ""),
                balance="url_param user",
                servers="\n".join(f"    server app{i + 1} {a}" for i, a in enumerate(backends)),
            )
        with open(os.path.join(tmp, "haproxy.cfg"), "w") as f:
            f.write(cfg)
        p = procs.start("haproxy", ["haproxy", "-db", "-f", os.path.join(tmp, "haproxy.cfg")])
        wait_ok(f"{scheme}://127.0.0.1:{hp}/bytes/200?user=x", "haproxy", procs)
        out["haproxy"] = (f"{scheme}://127.0.0.1:{hp}", [p.pid])

    if "nginx" in contenders:
        np_ = b + 20
        with open(os.path.join(HERE, "nginx.conf.in")) as f:
            cfg = f.read().format(
                dir=tmp,
                listen=f"127.0.0.1:{np_}",
                listen_tls=" ssl http2" if tls else "",
                tls=(f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]}; "
                     "ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m;") if tls else "",
                servers="\n".join(f"        server {a};" for a in backends),
            )
        with open(os.path.join(tmp, "nginx.conf"), "w") as f:
            f.write(cfg)
        p = procs.start("nginx", ["nginx", "-p", tmp, "-c", os.path.join(tmp, "nginx.conf"),
                                  "-g", "daemon off;"])
        wait_ok(f"{scheme}://127.0.0.1:{np_}/bytes/200?user=x", "nginx", procs)
        out["nginx"] = (f"{scheme}://127.0.0.1:{np_}", [p.pid])

    for c in contenders:
        if c in LAYOUT or c in BEFORE:
            out[c] = start_peerlb(c, args, tmp, procs, backends, tls)

    if "haproxy-kv" in contenders:
        kvs = [f"127.0.0.1:{b + 4 + i}" for i in range(3)]
        kv_pids = [procs.start(f"kv{i + 1}", [args.example, "--standalone", a]).pid
                   for i, a in enumerate(kvs)]
        hp = b + 12
        with open(os.path.join(HERE, "haproxy.cfg.in")) as f:
            cfg = f.read().format(
                dir=tmp, listen=f"127.0.0.1:{hp}", balance="uri",
                servers="\n".join(f"    server kv{i + 1} {a}" for i, a in enumerate(kvs)),
            )
        with open(os.path.join(tmp, "haproxy-kv.cfg"), "w") as f:
            f.write(cfg.replace("haproxy.pid", "haproxy-kv.pid"))
        p = procs.start("haproxy-kv", ["haproxy", "-db", "-f", os.path.join(tmp, "haproxy-kv.cfg")])
        for a in kvs:
            wait_port(a, "sharded_cache --standalone", procs)
        url = f"http://127.0.0.1:{hp}"
        wait_port(f"127.0.0.1:{hp}", "haproxy-kv", procs)
        kv_fill(url, "haproxy-kv")
        out["haproxy-kv"] = (url, [p.pid] + kv_pids)

    if "hop-floor" in contenders:
        # Cleartext at its entry, as peerlb-hop without --https.
        fdir, http, peer = os.path.join(tmp, "certs-floor"), f"127.0.0.1:{b + 400}", f"127.0.0.1:{b + 401}"
        subprocess.run([args.floor, "certs", fdir], check=True)
        owner = procs.start("floor-owner", [args.floor, "owner", fdir, peer])
        entry = procs.start("floor-entry", [args.floor, "entry", fdir, http, peer])
        wait_ok(f"http://{http}/bytes/200?user=x", "hop-floor", procs)
        out["hop-floor"] = (f"http://{http}", [entry.pid, owner.pid])
    return out, app_pids


# ------------------------------------------------------------------ wrk ----


def wrk(url, size, conns, think, duration, close=False, kv=False):
    """kv: GET /kv/u<k> (the key-value contenders) instead of /bytes/<size>?user=u<k>."""
    env = dict(os.environ, BENCH_PATH="/kv/" if kv else f"/bytes/{size}", BENCH_DELAY_MS=str(think),
               BENCH_CLOSE="1" if close else "0", BENCH_KEY_IN_PATH="1" if kv else "0")
    r = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--timeout", "10s",
         "-s", os.path.join(HERE, "keys.lua"), url + "/"],
        env=env, capture_output=True, text=True, check=False,
    )
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    sys.exit(f"wrk gave no RESULT line:\n{r.stdout}\n{r.stderr}")


def h2load(url, size, conns, duration, tmp):
    """HTTP/2 load with h2load (one thread, conns connections of H2_STREAMS
    streams each, duration seconds), the keys uniform over USERS users as
    with wrk (a file of URIs, shuffled with a fixed seed). Returns wrk's
    RESULT fields: latency percentiles (us) from h2load's per-request log."""
    import random

    uris = [f"{url}/bytes/{size}?user=u{k}" for k in range(1, USERS + 1)]
    random.Random(1).shuffle(uris)
    infile, log = os.path.join(tmp, "h2load-uris.txt"), os.path.join(tmp, "h2load-log.tsv")
    with open(infile, "w") as f:
        f.write("\n".join(uris) + "\n")
    r = subprocess.run(
        ["h2load", "-t1", f"-c{conns}", f"-m{H2_STREAMS}", f"-D{duration}", "-i", infile,
         f"--log-file={log}"],
        capture_output=True, text=True, check=False,
    )
    secs, counts = None, None
    for line in r.stdout.splitlines():
        if line.startswith("finished in "):
            t = line.split()[2].rstrip(",")
            for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
                if t.endswith(unit):
                    secs = float(t[: -len(unit)]) * scale
                    break
        if line.startswith("requests: "):
            counts = {w[1]: int(w[0]) for w in
                      (part.split() for part in line[len("requests: "):].split(","))}
    if secs is None or counts is None:
        sys.exit(f"h2load gave no summary:\n{r.stdout}\n{r.stderr}")
    lat = []
    with open(log) as f:
        for line in f:
            cols = line.split("\t")
            if len(cols) >= 3:
                lat.append(int(cols[2]))
    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q / 100 * len(lat)))] if lat else 0

    return {
        "requests": counts.get("succeeded", 0), "duration_us": int(secs * 1e6),
        "p50": pct(50), "p99": pct(99), "p999": pct(99.9),
        "connect": 0, "read": counts.get("errored", 0), "write": 0,
        "status": counts.get("failed", 0), "timeout": counts.get("timeout", 0),
    }


def measure(url, pids, app_pids, pt, duration, tmp, on_backends=True, kv=False):
    size, conns, think = pt[:3]
    bal = [q for p in pids for q in descendants(p)]
    reset_peak_rss(bal)
    sends = UdpSends(bal, os.path.join(tmp, "perf-stat.txt"))
    c0, a0 = cpu_ticks(bal), cpu_ticks(app_pids)
    s0, d0 = context_switches(bal), udp_out_datagrams()
    if mode(pt) == "h2":
        w = h2load(url, size, conns, duration, tmp)
    else:
        w = wrk(url, size, conns, think, duration, close=mode(pt) == "close", kv=kv)
    c1, a1 = cpu_ticks(bal), cpu_ticks(app_pids)
    s1, d1 = context_switches(bal), udp_out_datagrams()
    udp_sends, syscalls = sends.stop()
    n = max(1, w["requests"])
    secs = w["duration_us"] / 1e6
    errors = w["connect"] + w["read"] + w["write"] + w["status"] + w["timeout"]
    return {
        "rps": n / secs,
        "p50": w["p50"] / 1000,
        "p99": w["p99"] / 1000,
        "p999": w["p999"] / 1000,
        "cpu": (c1 - c0) / CLK_TCK / n * 10000 if pids else float("nan"),
        "app_cpu": (a1 - a0) / CLK_TCK / n * 10000,
        # Everything that serves the contender: the balancer and, for one
        # on the backends, the backends.
        "sys_cpu": ((c1 - c0) + ((a1 - a0) if on_backends else 0)) / CLK_TCK / n * 10000,
        "rss": peak_rss_kib(bal) / 1024 if pids else float("nan"),
        "cs": (s1 - s0) / n if pids else float("nan"),
        # The balancer's own UDP sends (perf), else the machine's datagrams.
        "dgrams": (udp_sends if udp_sends is not None else d1 - d0) / n if pids else float("nan"),
        "syscalls": syscalls / n if pids and syscalls is not None else float("nan"),
        "errors": errors,
    }


# --------------------------------------------------------------- report ----


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(x, spec):
    return "-" if x != x else format(x, spec)


def table(results, pt, contenders):
    rows = [
        f"### {point_label(pt)}",
        "",
        "| contender | req/s | spread | x HAProxy | p50 ms | p99 ms | p99.9 ms | CPU s/10k req | app CPU s/10k | system CPU s/10k | ctx sw/req | UDP sends/req | syscalls/req | peak RSS MiB | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in contenders:
        rs = results.get((pt, c), [])
        if not rs:
            continue
        rps = [r["rps"] for r in rs]
        ratio = per_round_ratio(results, pt, c, "haproxy", "rps") if "haproxy" in contenders else float("nan")
        spread = (max(rps) - min(rps)) / med(rps) * 100 if len(rps) > 1 else float("nan")
        rows.append(
            f"| {c} | {med(rps):,.0f} | {fmt(spread, '.0f')}% | {fmt(ratio, '.2f')} "
            f"| {med([r['p50'] for r in rs]):.2f} | {med([r['p99'] for r in rs]):.2f} "
            f"| {med([r['p999'] for r in rs]):.2f} | {fmt(med([r['cpu'] for r in rs]), '.2f')} "
            f"| {med([r['app_cpu'] for r in rs]):.2f} | {med([r['sys_cpu'] for r in rs]):.2f} "
            f"| {fmt(med([r['cs'] for r in rs]), '.2f')} "
            f"| {fmt(med([r['dgrams'] for r in rs]), '.2f')} | {fmt(med([r.get('syscalls', float('nan')) for r in rs]), '.2f')} "
            f"| {fmt(med([r['rss'] for r in rs]), '.1f')} "
            f"| {sum(r['errors'] for r in rs)} |"
        )
    return "\n".join(rows)


def per_round_ratio(results, pt, a, b, key):
    """Median over rounds of a/b (each round's pair measured seconds apart)."""
    ra, rb = results.get((pt, a), []), results.get((pt, b), [])
    out = []
    for i in range(min(len(ra), len(rb))):
        x, y = ra[i][key], rb[i][key]
        if y > 0:
            out.append(x / y)
    return med(out)


def ratio_lines(results, contenders, pts):
    """One line per ratio against HAProxy, direct and the -before binary."""
    ratios = []
    b, m = BASE, MODERATE
    at_b = f"{point_label(b)}"
    at_m = f"{point_label(m)}"
    for p in PEERLB:
        if p not in contenders:
            continue
        if "haproxy" in contenders:
            ratios.append(f"ratio {p}/haproxy req/s = {per_round_ratio(results, b, p, 'haproxy', 'rps'):.2f}  ({at_b})")
        if "direct" in contenders:
            ratios.append(f"ratio {p}/direct req/s = {per_round_ratio(results, b, p, 'direct', 'rps'):.2f}  ({at_b})")
        if "haproxy" in contenders and "direct" in contenders and m in pts:
            added_p, added_h = added_p99(results, m, p)
            ratio = added_p / added_h if added_h > 0 else float("nan")
            ratios.append(
                f"ratio {p}/haproxy added p99 = {fmt(ratio, '.2f')}  "
                f"({p} +{added_p:.2f} ms, haproxy +{added_h:.2f} ms over direct's median p99; "
                f"lower is better; {at_m})"
            )
        if "haproxy" in contenders and m in pts:
            ratios.append(f"ratio {p}/haproxy CPU per request = {per_round_ratio(results, m, p, 'haproxy', 'cpu'):.2f}  "
                          f"(lower is better; {at_m})")
        for pt, what in ((NEW_CONN, "new connections/s"), (H2, "HTTP/2 req/s")):
            if "haproxy" in contenders and pt in pts:
                ratios.append(f"ratio {p}/haproxy {what} = "
                              f"{per_round_ratio(results, pt, p, 'haproxy', 'rps'):.2f}  ({point_label(pt)})")
                ratios.append(f"ratio {p}/haproxy CPU per request = "
                              f"{per_round_ratio(results, pt, p, 'haproxy', 'cpu'):.2f}  "
                              f"(lower is better; {point_label(pt)})")
        q = p + "-before"
        if q in contenders:
            ratios.append(f"ratio {p}/{q} req/s = {per_round_ratio(results, b, p, q, 'rps'):.2f}  ({at_b})")
            for pt in (b, m):
                if pt in pts:
                    for key, what in (("cpu", "CPU per request"), ("cs", "context switches per request"),
                                      ("dgrams", "UDP sends per request"),
                                      ("syscalls", "system calls per request")):
                        ratios.append(f"ratio {p}/{q} {what} = {fmt(per_round_ratio(results, pt, p, q, key), '.2f')}  "
                                      f"(lower is better; {point_label(pt)})")
    # System CPU (every process that serves the contender) at every point.
    for pt in pts:
        for a, b_ in (("peerlb-hop", "hop-floor"), ("peerlb-hop-before", "hop-floor"),
                      ("hop-floor", "haproxy"), ("peerlb-3-builtin", "haproxy"),
                      ("peerlb-3", "haproxy"), ("peerlb-1", "haproxy")):
            if a in contenders and b_ in contenders:
                ratios.append(f"ratio {a}/{b_} system CPU per request = "
                              f"{fmt(per_round_ratio(results, pt, a, b_, 'sys_cpu'), '.2f')}  "
                              f"(lower is better; {point_label(pt)})")
    # The embedded store against the same store behind HAProxy.
    if "peerlb-3-embedded" in contenders and "haproxy-kv" in contenders:
        for pt in pts:
            if pt in KV_POINTS:
                for key, what in (("rps", "req/s"), ("sys_cpu", "system CPU per request")):
                    ratios.append(f"ratio peerlb-3-embedded/haproxy-kv {what} = "
                                  f"{fmt(per_round_ratio(results, pt, 'peerlb-3-embedded', 'haproxy-kv', key), '.2f')}  "
                                  f"({'lower is better; ' if key == 'sys_cpu' else ''}{point_label(pt)})")
    for h in ("peerlb-hop", "peerlb-hop-before"):
        for pt in (b, m):
            rs = results.get((pt, h), [])
            if rs:
                cpu = med([r["cpu"] for r in rs])
                ratios.append(
                    f"hop-only {h}: {10000 / cpu if cpu > 0 else float('nan'):,.0f} requests per CPU-second "
                    f"of the entry and the owner ({med([r['cs'] for r in rs]):.2f} context switches, "
                    f"{med([r['dgrams'] for r in rs]):.2f} UDP sends per request; {point_label(pt)})")
    return ratios


def added_p99(results, pt, c):
    """(c's, haproxy's) median p99 over direct's, in ms."""
    p99 = {x: med([r["p99"] for r in results.get((pt, x), [])]) for x in (c, "haproxy", "direct")}
    return p99[c] - p99["direct"], p99["haproxy"] - p99["direct"]


# The goals of docs/performance.md (issue 27, "The request path at its own
# design's floor"): (label, figure, comparison, bound). A figure is
# (point, contender, against, key) for a median of per-round ratios, or
# "rss".
GOALS = [
    ("peerlb-hop system CPU per request / hop-floor's, 16 connections",
     (BASE, "peerlb-hop", "hop-floor", "sys_cpu"), "<=", 1.2),
    ("peerlb-hop system CPU per request / hop-floor's, 128 connections",
     (C128, "peerlb-hop", "hop-floor", "sys_cpu"), "<=", 1.2),
    ("peerlb-3-builtin system CPU per request / HAProxy + three built-in backends, 16 connections",
     (BASE, "peerlb-3-builtin", "haproxy", "sys_cpu"), "<=", 1.0),
    ("the same at 128 connections", (C128, "peerlb-3-builtin", "haproxy", "sys_cpu"), "<=", 0.7),
    ("the same at moderate load", (MODERATE, "peerlb-3-builtin", "haproxy", "sys_cpu"), "<=", 1.3),
    ("peerlb-3-builtin req/s / HAProxy's, 16 connections",
     (BASE, "peerlb-3-builtin", "haproxy", "rps"), ">=", 1.0),
    ("peerlb-1 req/s / HAProxy's, 16 connections", (BASE, "peerlb-1", "haproxy", "rps"), ">=", 1.1),
    ("peerlb-1 CPU per request / HAProxy's, moderate load",
     (MODERATE, "peerlb-1", "haproxy", "cpu"), "<=", 0.9),
    ("peerlb-3 req/s / HAProxy's, 16 connections", (BASE, "peerlb-3", "haproxy", "rps"), ">=", 0.6),
    ("peerlb-3 system CPU / HAProxy's system CPU, moderate load",
     (MODERATE, "peerlb-3", "haproxy", "sys_cpu"), "<=", 2.0),
    ("peak RSS per node at saturation, MiB (largest of the peerlb contenders)", "rss", "<=", 24.0),
]


def goal_lines(results, contenders, pts):
    """One `goal` line per goal: its figure from this run, and met or missed."""
    have = set(contenders)
    out = []
    for label, what, cmp, bound in GOALS:
        v = None
        if what == "rss":
            rss = [med([r["rss"] for r in results.get((BASE, c), [])]) / NODES[c] for c in PEERLB if c in have]
            v = max(rss) if rss else None
        else:
            pt, a, b, key = what
            if pt in pts and a in have and b in have:
                v = per_round_ratio(results, pt, a, b, key)
        if v is None or v != v:
            out.append(f"goal {label}: not measured (needs its contenders and points)")
            continue
        ok = v <= bound if cmp == "<=" else v >= bound
        out.append(f"goal {label} = {v:.2f} (goal {cmp} {bound:g}): {'met' if ok else 'missed'}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 s runs, base and moderate-load points only (about 1 minute)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5, help="seconds per measurement")
    ap.add_argument("--points", choices=["all", "base", "sizes", "https", "kv"], default="all",
                    help="all: base, moderate load, size and concurrency sweeps; base: the first two; "
                         "sizes: the size sweep only; https: base, moderate load, a new connection "
                         "per request and HTTP/2 with h2load (the default with --https); kv: 16 "
                         "and 128 connections (the key-value contenders' comparison)")
    ap.add_argument("--https", action="store_true",
                    help="HAProxy, nginx and peerlb terminate TLS with one generated certificate "
                         "and the clients speak HTTPS to them (direct stays cleartext)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "peerlb"))
    ap.add_argument("--floor", metavar="BIN",
                    help="the hop's floor (benches/hop_floor.rs; bench/floor.sh builds it and "
                         "prints its path): the hop-floor contender, left out without it")
    ap.add_argument("--before", metavar="BIN",
                    help="also run peerlb-3-before and peerlb-1-before: the nodes of this "
                         "other peerlb binary, in the same rounds (before/after ratios)")
    ap.add_argument("--example", default=os.path.join(ROOT, "target", "release", "examples", "sharded_cache"),
                    help="examples/sharded_cache.rs built (cargo build --release --example sharded_cache): "
                         "the key-value contenders, left out when it is missing")
    ap.add_argument("--port-base", type=int, default=21000)
    ap.add_argument("--markdown", help="also write the tables and ratios to this file")
    ap.add_argument("--hold", action="store_true",
                    help="start everything, print the contenders' URLs and pids, and wait (for profiling)")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.points = 2, "base"
    if args.https and args.points == "all":
        args.points = "https"
    if args.points == "https" and not args.https:
        sys.exit("--points https needs --https")
    contenders = [c for c in args.contenders.split(",") if c]
    if not args.floor and "hop-floor" in contenders:
        if args.contenders != ",".join(CONTENDERS):
            sys.exit("hop-floor needs --floor BIN (bench/floor.sh builds it)")
        contenders.remove("hop-floor")
    if not os.access(args.example, os.X_OK) or args.https:
        # No example binary, or HTTPS (the key-value contenders are cleartext only).
        if any(c in KV for c in contenders) and args.contenders != ",".join(CONTENDERS):
            sys.exit(f"{','.join(KV)} need --example BIN (cargo build --release --example sharded_cache), cleartext")
        contenders = [c for c in contenders if c not in KV]
    if args.https and "hop-floor" in contenders:
        # The floor has no TLS at its entry: not a counterpart over HTTPS.
        contenders.remove("hop-floor")
    if args.before:
        contenders += [c + "-before" for c in PEERLB if c in contenders and c + "-before" not in contenders]
    for c in contenders:
        if c not in CONTENDERS + BEFORE:
            sys.exit(f"unknown contender {c}; known: {CONTENDERS}")
        if c in BEFORE and not args.before:
            sys.exit(f"{c} needs --before BIN")
    for tool in ["wrk", "haproxy", "nginx"] + (["openssl"] if args.https else []):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install -y haproxy nginx wrk")
    if args.https and not shutil.which("h2load"):
        print("h2load not found: no HTTP/2 point (apt-get install -y nghttp2-client)")
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"{args.bin}: not built (cargo build --release)")

    tmp = tempfile.mkdtemp(prefix="peerlb-bench-")
    procs = Procs(tmp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run(args, contenders, tmp, procs)
    finally:
        procs.stop_all()
        if os.environ.get("BENCH_KEEP"):
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args, contenders, tmp, procs):
    pts = points(args.points)
    load0 = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    print(f"binary: {args.bin}")
    print(f"{args.rounds} rounds x {len(pts)} points x {len(contenders)} contenders, "
          f"{args.duration} s each, wrk -t1, keys over {USERS} users"
          + (", HTTPS at the balancers" if args.https else ""))
    targets, app_pids = start_all(args, tmp, procs, contenders)
    if args.hold:
        for c, (url, pids) in targets.items():
            print(f"{c:<9} {url}  pids {' '.join(map(str, pids))}")
        print(f"backends pids {' '.join(map(str, app_pids))}; logs in {tmp}; Ctrl-C or SIGTERM stops", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        return
    # Warm-up: connection pools, page cache, QUIC congestion windows.
    for c in contenders:
        url, pids = targets[c]
        measure(url, pids, app_pids, BASE, 1, tmp, c in ON_BACKENDS, kv=c in KV)
    results = {}
    for r in range(args.rounds):
        for pt in pts:
            k = (r + pts.index(pt)) % len(contenders)
            for c in contenders[k:] + contenders[:k]:
                if mode(pt) == "h2" and c == "direct":
                    continue  # the backend speaks HTTP/1.1 only
                if c in KV and pt not in KV_POINTS:
                    continue  # 200-byte values only
                url, pids = targets[c]
                m = measure(url, pids, app_pids, pt, args.duration, tmp, c in ON_BACKENDS, kv=c in KV)
                results.setdefault((pt, c), []).append(m)
                think = f"+{pt[2]}ms" if pt[2] else (mode(pt) or "")
                print(f"round {r + 1} {size_label(pt[0]):>7} c={pt[1]:<3}{think:<5} {c:<15} "
                      f"{m['rps']:>9,.0f} req/s  p50 {m['p50']:.2f} p99 {m['p99']:.2f} "
                      f"p99.9 {m['p999']:.2f} ms  cpu {fmt(m['cpu'], '.2f')} s/10k  "
                      f"cs {fmt(m['cs'], '.2f')} udp {fmt(m['dgrams'], '.2f')} sys {fmt(m['syscalls'], '.1f')} /req  "
                      f"errors {m['errors']}", flush=True)
    load1 = os.getloadavg()
    out = [
        f"machine: {os.cpu_count()} cores; load average before {load0[0]:.2f}, after {load1[0]:.2f}; "
        f"{args.rounds} rounds, {args.duration} s per measurement; medians over rounds",
        "",
    ]
    for pt in pts:
        out += [table(results, pt, contenders), ""]
    ratios = ratio_lines(results, contenders, pts) + [""] + goal_lines(results, contenders, pts)
    text = "\n".join(out + ratios)
    print()
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
