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

All contenders stay up for the whole run; each measurement resets the
balancer's peak RSS (/proc/PID/clear_refs 5), reads its CPU ticks from
/proc/PID/stat before and after, and runs wrk (keys uniform over 10,000
`user` values, keep-alive). Rounds alternate the contenders (the order
rotates every round) so drift on a shared machine spreads over all of them;
the tables give medians over rounds, and the ratios are medians of the
per-round ratios (each taken from measurements seconds apart).

With --https, HAProxy, nginx and peerlb terminate TLS with one generated
certificate (ECDSA P-256, TLS 1.3 negotiated by wrk's OpenSSL) and wrk
speaks HTTPS to them (direct stays cleartext: the backend's limit). The
points are then the base and moderate-load points on keep-alive
connections (one handshake per connection: the cost of TLS records) and
a new-connection point, where every request carries `Connection: close`
so each costs a TCP connection and a TLS handshake (whether wrk resumes
sessions is up to its OpenSSL client): handshakes per second.
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

CONTENDERS = ["direct", "haproxy", "nginx", "peerlb-3", "peerlb-1"]
BEFORE = ["peerlb-3-before", "peerlb-1-before"]
# A point is (response bytes, connections, think time in ms per connection).
BASE = (200, 16, 0)  # saturation: the throughput ratios
MODERATE = (200, 16, 5)  # fixed moderate load (<= 3,200 req/s): added p99, CPU per request
# HTTPS only: a new connection (and TLS handshake) for every request.
NEW_CONN = (200, 16, 0, "close")
SIZES = [200, 16 * 1024, 1024 * 1024]
CONNS = [1, 16, 128]


def points(which):
    """The base point, the moderate-load point, then the size and concurrency sweeps."""
    if which == "https":
        return [BASE, MODERATE, NEW_CONN]
    if which == "base":
        return [BASE, MODERATE]
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
    s = f"{size_label(size)} responses, {conns} connection{'s' if conns > 1 else ''}"
    if think:
        s += f", {think} ms think time (moderate load)"
    if len(pt) > 3:
        s += ", a new connection per request"
    return s


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


def wait_serving(http, n, procs, timeout=30):
    """Waits until the node on client address `http` sees `n` serving
    members: its status on the admin address (client port + 1000, the
    default; the client port answers no admin path but the health check)."""
    import json

    host, port = http.rsplit(":", 1)
    admin = f"{host}:{int(port) + 1000}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            _, body = get(f"http://{admin}/_peerlb/status")
            if len(json.loads(body).get("serving", [])) == n:
                return
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.2)
    sys.exit(f"peerlb node {http} does not see {n} serving members; logs in {procs.logdir}")


def peerlb_cluster(name, bin_, tmp, procs, base_port, nodes, backends, listen, tls=None):
    """Writes a cluster.toml, makes certificates, starts the nodes; with
    `tls` (cert, key) the client listeners serve HTTPS."""
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
        argv = [bin_, "node", "--config", cfg, "--node", nid,
                "--app", f"http://{backends[i % len(backends)]}"]
        if nodes > 1:
            argv += ["--shared-listen", listen]
        pids.append(procs.start(nid, argv, env=env).pid)
    for _, http in specs:
        wait_serving(f"127.0.0.1:{http}", nodes, procs)
    return pids


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


def start_all(args, tmp, procs):
    """Starts backends and contenders; returns {contender: (url, pids)} and backend pids."""
    b = args.port_base
    tls = https_cert(tmp) if args.https else None
    scheme = "https" if tls else "http"
    backends = [f"127.0.0.1:{b + 1 + i}" for i in range(3)]
    want = [b + 1, b + 2, b + 3, b + 10, b + 20] + [b + 30 + i for i in range(3)]
    want += [b + 40 + i for i in range(3)] + [b + 50 + i for i in range(3)]
    want += [b + 60, b + 70, b + 80, b + 90]
    if args.before:
        want += [b + 100 + i for i in range(3)] + [b + 110 + i for i in range(3)]
        want += [b + 120 + i for i in range(3)] + [b + 130, b + 140, b + 150, b + 160]
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

    hp = b + 10
    with open(os.path.join(HERE, "haproxy.cfg.in")) as f:
        cfg = f.read().format(
            dir=tmp,
            listen=f"127.0.0.1:{hp}" + (f" ssl crt {tls[2]} alpn http/1.1" if tls else ""),
            servers="\n".join(f"    server app{i + 1} {a}" for i, a in enumerate(backends)),
        )
    with open(os.path.join(tmp, "haproxy.cfg"), "w") as f:
        f.write(cfg)
    p = procs.start("haproxy", ["haproxy", "-db", "-f", os.path.join(tmp, "haproxy.cfg")])
    wait_ok(f"{scheme}://127.0.0.1:{hp}/bytes/200?user=x", "haproxy", procs)
    out["haproxy"] = (f"{scheme}://127.0.0.1:{hp}", [p.pid])

    np_ = b + 20
    with open(os.path.join(HERE, "nginx.conf.in")) as f:
        cfg = f.read().format(
            dir=tmp,
            listen=f"127.0.0.1:{np_}",
            listen_tls=" ssl" if tls else "",
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

    shared = f"127.0.0.1:{b + 60}"
    pids = peerlb_cluster("p3", args.bin, tmp, procs, b + 30, 3, backends, shared, tls)
    wait_ok(f"{scheme}://{shared}/bytes/200?user=x", "peerlb-3", procs)
    out["peerlb-3"] = (f"{scheme}://{shared}", pids)

    pids = peerlb_cluster("p1", args.bin, tmp, procs, b + 70, 1, backends, None, tls)
    out["peerlb-1"] = (f"{scheme}://127.0.0.1:{b + 70}", pids)
    wait_ok(f"{scheme}://127.0.0.1:{b + 70}/bytes/200?user=x", "peerlb-1", procs)

    if args.before:
        shared = f"127.0.0.1:{b + 130}"
        pids = peerlb_cluster("b3", args.before, tmp, procs, b + 100, 3, backends, shared)
        wait_ok(f"http://{shared}/bytes/200?user=x", "peerlb-3-before", procs)
        out["peerlb-3-before"] = (f"http://{shared}", pids)
        pids = peerlb_cluster("b1", args.before, tmp, procs, b + 140, 1, backends, None)
        out["peerlb-1-before"] = (f"http://127.0.0.1:{b + 140}", pids)
        wait_ok(f"http://127.0.0.1:{b + 140}/bytes/200?user=x", "peerlb-1-before", procs)
    return out, app_pids


# ------------------------------------------------------------------ wrk ----


def wrk(url, size, conns, think, duration, close=False):
    env = dict(os.environ, BENCH_PATH=f"/bytes/{size}", BENCH_DELAY_MS=str(think),
               BENCH_CLOSE="1" if close else "0")
    r = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--timeout", "10s",
         "-s", os.path.join(HERE, "keys.lua"), url + "/"],
        env=env, capture_output=True, text=True, check=False,
    )
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    sys.exit(f"wrk gave no RESULT line:\n{r.stdout}\n{r.stderr}")


def measure(url, pids, app_pids, pt, duration):
    size, conns, think = pt[:3]
    bal = [q for p in pids for q in descendants(p)]
    reset_peak_rss(bal)
    c0, a0 = cpu_ticks(bal), cpu_ticks(app_pids)
    w = wrk(url, size, conns, think, duration, close=len(pt) > 3)
    c1, a1 = cpu_ticks(bal), cpu_ticks(app_pids)
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
        "rss": peak_rss_kib(bal) / 1024 if pids else float("nan"),
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
        "| contender | req/s | spread | x HAProxy | p50 ms | p99 ms | p99.9 ms | CPU s/10k req | app CPU s/10k | peak RSS MiB | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
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
            f"| {med([r['app_cpu'] for r in rs]):.2f} | {fmt(med([r['rss'] for r in rs]), '.1f')} "
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 s runs, base and moderate-load points only (about 1 minute)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5, help="seconds per measurement")
    ap.add_argument("--points", choices=["all", "base", "sizes", "https"], default="all",
                    help="all: base, moderate load, size and concurrency sweeps; base: the first two; "
                         "sizes: the size sweep only; https: base, moderate load and a new "
                         "connection per request (the default with --https)")
    ap.add_argument("--https", action="store_true",
                    help="HAProxy, nginx and peerlb terminate TLS with one generated certificate "
                         "and wrk speaks HTTPS to them (direct stays cleartext)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "peerlb"))
    ap.add_argument("--before", metavar="BIN",
                    help="also run peerlb-3-before and peerlb-1-before: the nodes of this "
                         "other peerlb binary, in the same rounds (before/after ratios)")
    ap.add_argument("--port-base", type=int, default=21000)
    ap.add_argument("--markdown", help="also write the tables and ratios to this file")
    ap.add_argument("--hold", action="store_true",
                    help="start everything, print the contenders' URLs and pids, and wait (for profiling)")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.points = 2, "base"
    if args.https and args.points == "all":
        args.points = "https"
    contenders = [c for c in args.contenders.split(",") if c]
    if args.before:
        contenders += [c for c in BEFORE if c not in contenders]
    for c in contenders:
        if c not in CONTENDERS + BEFORE:
            sys.exit(f"unknown contender {c}; known: {CONTENDERS}")
        if c in BEFORE and not args.before:
            sys.exit(f"{c} needs --before BIN")
    for tool in ["wrk", "haproxy", "nginx"] + (["openssl"] if args.https else []):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install -y haproxy nginx wrk")
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
          f"{args.duration} s each, wrk -t1, keys over 10000 users"
          + (", HTTPS at the balancers" if args.https else ""))
    targets, app_pids = start_all(args, tmp, procs)
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
        measure(url, pids, app_pids, BASE, 1)
    results = {}
    for r in range(args.rounds):
        for pt in pts:
            k = (r + pts.index(pt)) % len(contenders)
            for c in contenders[k:] + contenders[:k]:
                url, pids = targets[c]
                m = measure(url, pids, app_pids, pt, args.duration)
                results.setdefault((pt, c), []).append(m)
                think = f"+{pt[2]}ms" if pt[2] else ("new" if len(pt) > 3 else "")
                print(f"round {r + 1} {size_label(pt[0]):>7} c={pt[1]:<3}{think:<5} {c:<15} "
                      f"{m['rps']:>9,.0f} req/s  p50 {m['p50']:.2f} p99 {m['p99']:.2f} "
                      f"p99.9 {m['p999']:.2f} ms  cpu {fmt(m['cpu'], '.2f')} s/10k  "
                      f"errors {m['errors']}", flush=True)
    load1 = os.getloadavg()
    out = [
        f"machine: {os.cpu_count()} cores; load average before {load0[0]:.2f}, after {load1[0]:.2f}; "
        f"{args.rounds} rounds, {args.duration} s per measurement; medians over rounds",
        "",
    ]
    for pt in pts:
        out += [table(results, pt, contenders), ""]
    ratios = []
    b, m = BASE, MODERATE
    at_b = f"{point_label(b)}"
    at_m = f"{point_label(m)}"
    for p in ["peerlb-3", "peerlb-1"]:
        if p not in contenders:
            continue
        if "haproxy" in contenders:
            ratios.append(f"ratio {p}/haproxy req/s = {per_round_ratio(results, b, p, 'haproxy', 'rps'):.2f}  ({at_b})")
        if "direct" in contenders:
            ratios.append(f"ratio {p}/direct req/s = {per_round_ratio(results, b, p, 'direct', 'rps'):.2f}  ({at_b})")
        if "haproxy" in contenders and "direct" in contenders and m in pts:
            p99 = {c: med([r["p99"] for r in results.get((m, c), [])]) for c in (p, "haproxy", "direct")}
            added_p, added_h = p99[p] - p99["direct"], p99["haproxy"] - p99["direct"]
            ratio = added_p / added_h if added_h > 0 else float("nan")
            ratios.append(
                f"ratio {p}/haproxy added p99 = {fmt(ratio, '.2f')}  "
                f"({p} +{added_p:.2f} ms, haproxy +{added_h:.2f} ms over direct's median p99; "
                f"lower is better; {at_m})"
            )
        if "haproxy" in contenders and m in pts:
            ratios.append(f"ratio {p}/haproxy CPU per request = {per_round_ratio(results, m, p, 'haproxy', 'cpu'):.2f}  "
                          f"(lower is better; {at_m})")
        if "haproxy" in contenders and NEW_CONN in pts:
            ratios.append(f"ratio {p}/haproxy new connections/s = "
                          f"{per_round_ratio(results, NEW_CONN, p, 'haproxy', 'rps'):.2f}  ({point_label(NEW_CONN)})")
            ratios.append(f"ratio {p}/haproxy CPU per new connection = "
                          f"{per_round_ratio(results, NEW_CONN, p, 'haproxy', 'cpu'):.2f}  "
                          f"(lower is better; {point_label(NEW_CONN)})")
        q = p + "-before"
        if q in contenders:
            ratios.append(f"ratio {p}/{q} req/s = {per_round_ratio(results, b, p, q, 'rps'):.2f}  ({at_b})")
            if m in pts:
                ratios.append(f"ratio {p}/{q} CPU per request = {per_round_ratio(results, m, p, q, 'cpu'):.2f}  "
                              f"(lower is better; {at_m})")
    text = "\n".join(out + ratios)
    print()
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
