#!/usr/bin/env python3
"""Bounded load under a hot key, in a live 3-node cluster on loopback.

docs/performance.md, "Bounded load under a hot key": three `peerlb node`
processes behind one shared address (SO_REUSEPORT: the kernel as sprayer),
the built-in app answering `/delay/50` (50 ms), and wrk with 32 connections
sending half of its requests with the key `hot` and the rest over 10,000
keys. Each node's `app_inflight` (the requests its app serves now, from its
status) is read every 50 ms; a sample is over the bound when the busiest
node holds more than 1.25 x mean + 1. Run once with
`balance.hash_balance_factor = 1.25` and once without it, the same load.

    bench/hot-key-live.py [--bin target/release/peerlb] [--duration 10]

Prints, for each run: requests per node, the busiest node's share of the
requests over the mean, and the samples over the bound. Needs wrk.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

LUA = r"""
local n = 0
function request()
  n = n + 1
  if math.random() < 0.5 then
    return wrk.format("GET", "/delay/50?user=hot")
  end
  return wrk.format("GET", "/delay/50?user=u" .. math.random(10000))
end
"""


def status(admin):
    with urllib.request.urlopen(f"http://{admin}/_peerlb/status", timeout=1) as r:
        return json.loads(r.read())


def run(bin_, tmp, base, bounded, duration, factor):
    name = "hot-bounded" if bounded else "hot-unbounded"
    d = os.path.join(tmp, name)
    os.makedirs(d)
    shared = f"127.0.0.1:{base + 30}"
    lines = [f'name = "{name}"', 'policy = "consistent-hash"', 'app = "builtin"',
             "[tls]", f'dir = "{d}/certs"']
    if bounded:
        lines += ["[balance]", f"hash_balance_factor = {factor}"]
    nodes = []
    for i in range(3):
        http = base + i
        nodes.append((f"n{i + 1}", f"127.0.0.1:{http}", f"127.0.0.1:{http + 1000}"))
        lines += ["[[nodes]]", f'id = "n{i + 1}"', f'http_addr = "127.0.0.1:{http}"',
                  f'peer_addr = "127.0.0.1:{base + 10 + i}"',
                  f'gossip_addr = "127.0.0.1:{base + 20 + i}"']
    lines += ["[[rules]]", 'name = "user"', 'extract = [{ query = "user" }]']
    cfg = os.path.join(d, "cluster.toml")
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run([bin_, "certs", "--config", cfg], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = []
    try:
        for nid, _, _ in nodes:
            log = open(os.path.join(d, f"{nid}.log"), "wb")
            procs.append(subprocess.Popen(
                [bin_, "node", "--config", cfg, "--node", nid, "--shared-listen", shared],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if all(len(status(a)["serving"]) == 3 for _, _, a in nodes):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.2)
        else:
            sys.exit(f"{name}: the cluster did not come up; logs in {d}")
        before = {nid: status(a)["counters"]["served_local"] for nid, _, a in nodes}
        samples = []
        stop = threading.Event()

        def sample():
            next_at = time.time()
            while not stop.is_set():
                try:
                    samples.append([status(a)["app_inflight"] for _, _, a in nodes])
                except Exception:  # noqa: BLE001 - a missed sample
                    pass
                next_at += 0.05
                time.sleep(max(0.0, next_at - time.time()))

        lua = os.path.join(d, "hot.lua")
        with open(lua, "w") as f:
            f.write(LUA)
        wrk = subprocess.Popen(
            ["wrk", "-t2", "-c32", f"-d{duration}s", "-s", lua, f"http://{shared}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # Samples from 1 s in (the connections open) to the end.
        time.sleep(1)
        t = threading.Thread(target=sample)
        t.start()
        out, _ = wrk.communicate()
        stop.set()
        t.join()
        after = {nid: status(a)["counters"]["served_local"] for nid, _, a in nodes}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
    served = {n: after[n] - before[n] for n in after}
    mean = statistics.mean(served.values())
    over = sum(1 for s in samples if max(s) > factor * (sum(s) / len(s)) + 1)
    rps = next((line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")), "?")
    return {
        "run": "hash_balance_factor = %s" % factor if bounded else "no bound",
        "served": served,
        "ratio": max(served.values()) / mean if mean else 0.0,
        "over": over,
        "samples": len(samples),
        "rps": rps,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/peerlb")
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--factor", type=float, default=1.25)
    ap.add_argument("--port-base", type=int, default=24000)
    a = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is missing (apt-get install -y wrk)")
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} is missing (cargo build --release)")
    tmp = tempfile.mkdtemp(prefix="peerlb-hot-key-")
    rows = [run(a.bin, tmp, a.port_base, False, a.duration, a.factor),
            run(a.bin, tmp, a.port_base + 100, True, a.duration, a.factor)]
    print("| run | requests served per node | busiest / mean | req/s | samples above %.2f x mean + 1 |" % a.factor)
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        served = " / ".join(f"{n} {c}" for n, c in sorted(r["served"].items()))
        pct = 100.0 * r["over"] / max(1, r["samples"])
        print(f"| {r['run']} | {served} | {r['ratio']:.2f} | {r['rps']} | {r['over']} of {r['samples']} ({pct:.1f} %) |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
