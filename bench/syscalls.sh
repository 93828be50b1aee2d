#!/usr/bin/env bash
# System calls and context switches per forwarded request, at the entry and
# at the owner, one request at a time: figures that a loaded, shared
# machine does not move (CPU seconds do; bench/compare.sh measures those).
#
#   bench/syscalls.sh [BIN ...]      # each binary in turn
#   N=5000 bench/syscalls.sh BIN     # more requests per measurement
#   FLOOR= bench/syscalls.sh BIN     # without the hop's floor
#
# Two nodes with the built-in app, the entry's weight 0 so every request
# crosses the QUIC hop; one keep-alive connection from a Python client
# that sends a request, reads its whole answer, sends the next. `perf stat`
# counts each node's system calls (raw_syscalls:sys_enter) by name over N
# requests after a warm-up; /proc/PID/status gives the context switches.
# Then the same for the hop's floor (benches/hop_floor.rs: its entry and
# owner; built by bench/floor.sh unless FLOOR names its binary).
#
# Needs perf (linux-perf) and python3, as root or with
# kernel.perf_event_paranoid <= -1. Not part of CI.
# Ports 127.0.0.1:23401-23422. Default BIN: target/release/peerlb (built).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "perf is missing (apt-get install -y linux-perf)" >&2; exit 1; }
N=${N:-2000}
if [ $# -eq 0 ]; then
  cargo build --release --bin peerlb >/dev/null 2>&1 || cargo build --release --bin peerlb
  set -- target/release/peerlb
fi
if [ -z "${FLOOR+set}" ]; then
  FLOOR=$(bench/floor.sh)
fi
work=$(mktemp -d /tmp/peerlb-syscalls-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# The client of bench/instructions.sh.
sed -n '/^cat >"\$work\/client.py"/,/^EOF$/p' bench/instructions.sh | sed '1d;$d' >"$work/client.py"
cat >"$work/hop.toml" <<EOF
name = "syscalls-hop"
app = "builtin"
[tls]
dir = "$work/certs"
[[nodes]]
id = "h1"
http_addr = "127.0.0.1:23401"
peer_addr = "127.0.0.1:23411"
gossip_addr = "127.0.0.1:23421"
weight = 0
[[nodes]]
id = "h2"
http_addr = "127.0.0.1:23402"
peer_addr = "127.0.0.1:23412"
gossip_addr = "127.0.0.1:23422"
[[rules]]
name = "user"
extract = [{ query = "user" }]
EOF

ctxsw() { awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n}' "/proc/$1/status"; }

# Prints, for `perf stat -x,` output in $1 over $2 requests: total and the
# calls made at least 0.05 times per request, by name.
per_request() {
  awk -F, -v n="$2" '$3 ~ /^syscalls:sys_enter_/ && $1 ~ /^[0-9]+$/ {
      name = substr($3, 20); total += $1
      if ($1 / n >= 0.05) parts = parts sprintf(" %s %.2f", name, $1 / n)
    } END { printf "%.2f  (%s )", total / n, parts }' "$1"
}

printf '%-40s %-6s %10s %10s  %s\n' binary node "ctx sw/req" "calls/req" "by name, per request"
# count LABEL ENTRY_PID OWNER_PID: warms up, then counts N requests.
count() {
  local label=$1 entry=$2 owner=$3
  python3 "$work/client.py" 300 23401
  declare -A cs0=([entry]=$(ctxsw $entry) [owner]=$(ctxsw $owner))
  perf stat -x, -e 'syscalls:sys_enter_*' -p "$entry" -o "$work/entry.perf" &
  pe=$!
  perf stat -x, -e 'syscalls:sys_enter_*' -p "$owner" -o "$work/owner.perf" &
  po=$!
  sleep 0.5
  python3 "$work/client.py" "$N" 23401
  kill -INT $pe $po
  wait $pe $po 2>/dev/null || true
  for node in entry owner; do
    pid=$entry
    [ $node = owner ] && pid=$owner
    cs=$(awk -v a="${cs0[$node]}" -v b="$(ctxsw $pid)" -v n="$N" 'BEGIN {printf "%.2f", (b - a) / n}')
    read -r calls rest <<<"$(per_request "$work/$node.perf" "$N")"
    printf '%-40s %-6s %10s %10s  %s\n' "$label" $node "$cs" "$calls" "$rest"
  done
}

for bin in "$@"; do
  "$bin" certs --config "$work/hop.toml" >/dev/null 2>&1
  "$bin" node --config "$work/hop.toml" --node h1 >"$work/h1.log" 2>&1 &
  entry=$!
  "$bin" node --config "$work/hop.toml" --node h2 >"$work/h2.log" 2>&1 &
  owner=$!
  # Warm-up: until the owner serves (the entry serves itself until it has
  # a connection to the owner), then 300 requests.
  for _ in $(seq 300); do
    if curl -s -D - -o /dev/null "http://127.0.0.1:23401/bytes/1?user=w" 2>/dev/null | grep -qi '^peerlb-served-by: h2'; then
      break
    fi
    sleep 0.1
  done
  count "$bin" $entry $owner
  kill $entry $owner 2>/dev/null || true
  wait $entry $owner 2>/dev/null || true
  rm -rf "$work/certs"
done
if [ -n "$FLOOR" ]; then
  "$FLOOR" certs "$work/certs-floor"
  "$FLOOR" owner "$work/certs-floor" 127.0.0.1:23412 >"$work/floor-owner.log" 2>&1 &
  owner=$!
  "$FLOOR" entry "$work/certs-floor" 127.0.0.1:23401 127.0.0.1:23412 >"$work/floor-entry.log" 2>&1 &
  entry=$!
  for _ in $(seq 300); do
    curl -s -o /dev/null "http://127.0.0.1:23401/bytes/1?user=w" 2>/dev/null && break
    sleep 0.1
  done
  count hop-floor $entry $owner
  kill $entry $owner 2>/dev/null || true
  wait $entry $owner 2>/dev/null || true
fi
