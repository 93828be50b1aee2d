#!/usr/bin/env bash
# Simulation speed benchmark (issue: simulated time per wall time, 10 nodes):
#   bench/sim-speed.sh              # 10 nodes idle, 100 and 1000 req/s; tick 1 ms and 10 ms
#   bench/sim-speed.sh --nodes 5    # another cluster size
#   bench/sim-speed.sh --nodes 100 --rates "0 100" --ticks 1   # some variants only
#   bench/sim-speed.sh --nodes 100 --dial on_demand   # peer.dial (default at_sight)
# Builds peerlb-sim (simulations/peerlb-sim, `sim` profile: opt-level 3,
# --cfg tokio_unstable, target-sim/) and runs variants of
# simulations/steady-10.toml, one process each, one after another. Prints
# one line per run (with the peer-layer datagrams each node sent per
# second, from 3 s on) and the cost split: wall time per simulated second of an
# idle cluster (gossip, QUIC keep-alives, turmoil's ticks) and wall time per
# simulated request (the real hyper, quinn, rustls and engine work of one
# request through the cluster). Not part of CI; report ratios from one run.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=10
rates="0 100 1000"
ticks="1 10"
dial=at_sight
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --rates) rates="$2"; shift 2 ;;
    --ticks) ticks="$2"; shift 2 ;;
    --dial) dial="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
sim=simulations/peerlb-sim
"$sim" --help >/dev/null
bin="${SIM_TARGET_DIR:-$PWD/target-sim}/${SIM_PROFILE:-sim}/peerlb-sim"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
duration=20
scenario() { # name rate tick
  {
    echo "description = \"sim-speed: $nodes nodes, $2 req/s, tick $3 ms\""
    echo "nodes = $nodes"
    echo "duration_s = $duration"
    echo "seeds = [1]"
    echo "cluster = '''"
    echo "[peer]"
    echo "dial = \"$dial\""
    echo "'''"
    echo "[network]"
    echo "tick_ms = $3"
    if [ "$2" -gt 0 ]; then
      echo "[[traffic]]"
      echo "clients = 4"
      echo "rate = $(($2 / 4))"
      echo "start_s = 2"
      echo "stop_s = 19.5"
      echo 'keys = "zipf"'
      echo "key_count = 10000"
    fi
  } > "$dir/$1.toml"
}
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $nodes nodes, peer.dial $dial, $duration s simulated per run"
printf '%-6s %-8s %10s %10s %10s %10s %12s %14s\n' tick rate requests wall_s user_s "sim/wall" "wall/sim_s" "peer_dgram/s"
results=()
for tick in $ticks; do
  for rate in $rates; do
    name="t${tick}-r${rate}"
    scenario "$name" "$rate" "$tick"
    # Idle runs have nothing to serve: their min_served check fails, which
    # does not matter here (only the speed line is read).
    # User CPU time too: wall time on a shared machine says little.
    out=$( { /usr/bin/time -f 'user-cpu %U' "$bin" "$dir/$name.toml" 2>&1 || true; } 2>&1)
    user=$(grep -m1 '^user-cpu ' <<<"$out" | cut -d' ' -f2)
    line=$(grep -m1 '^scenario ' <<<"$out")
    wall=$(sed -E 's/.* in ([0-9.]+)s wall.*/\1/' <<<"$line")
    simulated=$(sed -E 's/.*simulated ([0-9.]+)s in.*/\1/' <<<"$line")
    sent=$(grep -m1 '^requests: ' <<<"$out" | sed -E 's/requests: sent ([0-9]+).*/\1/')
    ratio=$(python3 -c "print(f'{$simulated/$wall:.1f}x')")
    per=$(python3 -c "print(f'{1000*$wall/$simulated:.1f} ms')")
    # Peer-layer datagrams per node per second from 3 s to the end.
    dgrams=$(grep -m1 '^peer datagrams: ' <<<"$out" | sed -E 's/.*running ([0-9.]+) per node.*/\1/; t; s/.*/-/')
    printf '%-6s %-8s %10s %10s %10s %10s %12s %14s\n' "${tick}ms" "$rate/s" "$sent" "$wall" "$user" "$ratio" "$per" "$dgrams"
    results+=("$tick $rate $sent $wall $simulated")
  done
done
python3 - "${results[@]}" <<'PY'
import sys
rows = [tuple(float(x) for x in r.split()) for r in sys.argv[1:]]
for tick in sorted({r[0] for r in rows}):
    rs = {r[1]: r for r in rows if r[0] == tick}
    if 0 not in rs:
        continue
    idle = rs[0]
    idle_ms = 1000 * idle[3] / idle[4]
    print(f"tick {tick:.0f} ms: idle cluster {idle_ms:.1f} ms wall per simulated second", end="")
    for rate in sorted(k for k in rs if k > 0):
        r = rs[rate]
        if r[2] > 0:
            us = 1e6 * (r[3] - idle[3]) / r[2]
            print(f"; at {rate:.0f} req/s {us:.0f} us wall per request", end="")
    print()
print("100x needs at most 10 ms of wall time per simulated second, idle cost and requests together.")
PY
