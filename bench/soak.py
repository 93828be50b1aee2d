#!/usr/bin/env python3
"""Soak test: steady load on a 3-node loopback cluster while its owners are
killed and restarted, reporting errors and RSS every minute.

The load (wrk, GETs keyed on `user` so every node owns some) enters through
n1, which is never killed; n2 and n3 take turns being killed with SIGKILL
and restarted. Every request is a GET, so every one that an owner's death
interrupts is replayable: the goal is 0 failed requests (non-2xx, socket
errors, timeouts) and flat RSS. Run through bench/soak.sh; not part of CI.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

LUA = """
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/soak?user=u" .. (counter % 997))
end
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Cluster:
    def __init__(self, binary, work):
        self.bin = binary
        self.work = work
        self.nodes = {}
        for i in (1, 2, 3):
            self.nodes[f"n{i}"] = {
                "http": free_port(),
                "peer": free_port(),
                "gossip": free_port(),
                "admin": free_port(),
            }
        text = 'name = "soak"\n[ring]\nvnodes = 1024\n'
        text += '[gossip]\ninterval_ms = 100\nphi_threshold = 30\n'
        text += '\n'
        for nid, n in self.nodes.items():
            text += (
                f'[[nodes]]\nid = "{nid}"\nhttp_addr = "127.0.0.1:{n["http"]}"\n'
                f'peer_addr = "127.0.0.1:{n["peer"]}"\ngossip_addr = "127.0.0.1:{n["gossip"]}"\n'
                f'admin_addr = "127.0.0.1:{n["admin"]}"\n\n'
            )
        text += '[[rules]]\nextract = [{ query = "user" }]\n'
        self.config = os.path.join(work, "cluster.toml")
        with open(self.config, "w") as f:
            f.write(text)
        subprocess.run([binary, "certs", "--config", self.config], check=True, capture_output=True)
        self.procs = {}

    def start(self, nid):
        log = open(os.path.join(self.work, f"{nid}.log"), "a")
        self.procs[nid] = subprocess.Popen(
            [self.bin, "node", "--node", nid, "--config", self.config],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env=dict(os.environ, RUST_LOG="warn"),
        )

    def kill(self, nid):
        p = self.procs.pop(nid)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def serving(self, nid):
        try:
            url = f"http://127.0.0.1:{self.nodes[nid]['admin']}/_peerlb/status"
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.load(r)["serving"]
        except Exception:
            return None

    def wait_serving(self, n, limit=60):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if all(len(self.serving(nid) or []) == n for nid in self.procs):
                return True
            time.sleep(0.2)
        return False

    def stop(self):
        for p in self.procs.values():
            p.send_signal(signal.SIGKILL)
            p.wait()


def parse_wrk(out):
    def num(pattern):
        m = re.search(pattern, out)
        return int(m.group(1)) if m else 0
    requests = num(r"(\d+) requests in")
    detail = re.search(r"Socket errors: .*", out)
    non2xx = num(r"Non-2xx or 3xx responses: (\d+)")
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    socket_errors = sum(int(x) for x in m.groups()) if m else 0
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p99 = re.search(r"\s99%\s+([\d.]+\w+)", out)
    return (requests, non2xx, socket_errors, float(rps.group(1)) if rps else 0.0,
            p99.group(1) if p99 else "-", detail.group(0) if detail else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="the peerlb binary")
    ap.add_argument("--minutes", type=int, default=30, help="how long to run (default 30)")
    ap.add_argument("--kill-every", type=float, default=20.0,
                    help="seconds between kills; the killed node restarts after half of it (default 20)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--rate", type=int, default=0,
                    help="unused: wrk has no rate limit; the load is closed-loop on --connections")
    a = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("missing: wrk (apt-get install -y wrk)")
    work = tempfile.mkdtemp(prefix="peerlb-soak-")
    lua = os.path.join(work, "soak.lua")
    with open(lua, "w") as f:
        f.write(LUA)
    c = Cluster(a.bin, work)
    for nid in c.nodes:
        c.start(nid)
    if not c.wait_serving(3):
        c.stop()
        sys.exit(f"the cluster did not converge; logs in {work}")
    stop = threading.Event()
    events = []

    def chaos():
        victim = "n2"
        while not stop.wait(a.kill_every / 2):
            c.kill(victim)
            events.append(f"kill {victim}")
            if stop.wait(a.kill_every / 2):
                break
            c.start(victim)
            events.append(f"restart {victim}")
            victim = "n3" if victim == "n2" else "n2"

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{c.nodes['n1']['http']}"
    print(f"soak: {a.minutes} min, kill every {a.kill_every:.0f} s (n2, n3 in turn), "
          f"wrk -c{a.connections} into n1; logs in {work}", flush=True)
    print("| minute | requests | req/s | p99 | non-2xx | socket errors | kills | RSS n1 | RSS n2 | RSS n3 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    total_req = total_fail = 0
    rss_n1 = []
    try:
        for minute in range(1, a.minutes + 1):
            out = subprocess.run(
                ["wrk", "-t2", f"-c{a.connections}", "-d60s", "--timeout", "10s", "--latency",
                 "-s", lua, url],
                capture_output=True, text=True,
            ).stdout
            req, non2xx, sock, rps, p99, detail = parse_wrk(out)
            if detail:
                print(f"  minute {minute}: {detail}", file=sys.stderr, flush=True)
            kills = sum(1 for e in events if e.startswith("kill"))
            events.clear()
            rss = {nid: rss_kb(p.pid) for nid, p in c.procs.items()}
            fmt = lambda n: f"{rss[n] / 1024:.1f} MB" if rss.get(n) else "down"
            total_req += req
            total_fail += non2xx + sock
            rss_n1.append(rss.get("n1") or 0)
            print(f"| {minute} | {req} | {rps:.0f} | {p99} | {non2xx} | {sock} | {kills} | "
                  f"{fmt('n1')} | {fmt('n2')} | {fmt('n3')} |", flush=True)
    finally:
        stop.set()
        t.join(timeout=a.kill_every)
        c.stop()
    print(f"total: {total_req} requests, {total_fail} failed; "
          f"n1 RSS first {rss_n1[0] / 1024:.1f} MB, last {rss_n1[-1] / 1024:.1f} MB, "
          f"max {max(rss_n1) / 1024:.1f} MB", flush=True)
    return 0 if total_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
