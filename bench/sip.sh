#!/usr/bin/env bash
# SIP benchmark on loopback: SIPp's built-in `uac` scenario (INVITE, ACK,
# BYE) through
#
#   peerlb-3   3 peerlb nodes, every call entering node 1's sip_addr (about
#              2/3 of them cross the QUIC hop to their owner), each owner
#              relaying to the UAS (`sip_app = "udp:..."`)
#   kamailio   Kamailio with the dispatcher module, hash over Call-ID
#              (ds_select_dst algorithm 0), transaction-stateful (t_relay)
#
# in front of the same UAS (SIPp's built-in `uas` scenario). One short run
# each, the same offered rate: calls per second that completed, and CPU
# per call of the balancer processes (every peerlb node, every Kamailio
# process; user + system ticks from /proc/PID/stat). The machine is shared
# and small: read the ratios, not the absolute figures, and rerun before
# believing a change.
#
# Usage: bench/sip.sh [calls] [rate]      (default 3000 calls at 500/s)
# Needs: sipp (Debian sip-tester), kamailio, curl; builds the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."

CALLS=${1:-3000}
RATE=${2:-500}
for tool in sipp kamailio curl; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install -y sip-tester kamailio curl)"; exit 1; }
done
cargo build --release -q
BIN=$PWD/target/release/peerlb
DIR=$(mktemp -d /tmp/peerlb-sip-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] && echo "kept $DIR" || rm -rf "$DIR"
}
trap cleanup EXIT

# A free TCP/UDP port on 127.0.0.1 (the kernel picks; a race with other
# programs is possible but unlikely on a test machine).
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# user + system clock ticks of processes $@ (from /proc/PID/stat).
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
HZ=$(getconf CLK_TCK)

UAS_PORT=$(port)
sipp -sn uas -i 127.0.0.1 -p "$UAS_PORT" -nostdin >"$DIR/uas.log" 2>&1 &
PIDS+=($!)

# peerlb: 3 nodes, the UAS as every owner's sip_app.
{
  echo "name = \"sip-bench\""
  echo "sip_app = \"udp:127.0.0.1:$UAS_PORT\""
  # SIPp sends every call from one address, as a trunk does: 3 datagrams
  # a call, 1,500 a second at 500 calls a second, past the default
  # per-source limit (1,000 a second, configuration.md); Kamailio's
  # configuration below loads no pike either.
  echo "[limits]"
  echo "sip_udp_requests_per_source = 0"
  echo "[tls]"
  echo "dir = \"$DIR/certs\""
  for i in 1 2 3; do
    echo "[[nodes]]"
    echo "id = \"n$i\""
    echo "http_addr = \"127.0.0.1:$(port)\""
    echo "peer_addr = \"127.0.0.1:$(port)\""
    echo "gossip_addr = \"127.0.0.1:$(port)\""
    echo "admin_addr = \"127.0.0.1:$(port)\""
    echo "sip_addr = \"127.0.0.1:$(port)\""
  done
} >"$DIR/cluster.toml"
"$BIN" certs --config "$DIR/cluster.toml" >/dev/null
PEERLB=()
for i in 1 2 3; do
  "$BIN" node --node "n$i" --config "$DIR/cluster.toml" >"$DIR/n$i.log" 2>&1 &
  PIDS+=($!)
  PEERLB+=($!)
done
ADMIN1=$(awk -F'"' '/^admin_addr/ {print $2; exit}' "$DIR/cluster.toml")
SIP1=$(awk -F'"' '/^sip_addr/ {print $2; exit}' "$DIR/cluster.toml")
for _ in $(seq 1 300); do
  n=$(curl -s "http://$ADMIN1/_peerlb/status" 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["serving"]))' 2>/dev/null || echo 0)
  [ "$n" = 3 ] && break
  sleep 0.1
done
[ "$n" = 3 ] || { echo "peerlb did not converge"; tail "$DIR"/n*.log; exit 1; }

# Kamailio: dispatcher, hash over Call-ID, in front of the same UAS.
KAM_PORT=$(port)
echo "1 sip:127.0.0.1:$UAS_PORT" >"$DIR/dispatcher.list"
cat >"$DIR/kamailio.cfg" <<EOF
#!KAMAILIO
debug=0
log_stderror=yes
children=4
tcp_children=1
listen=udp:127.0.0.1:$KAM_PORT
mpath="/usr/lib/x86_64-linux-gnu/kamailio/modules/"
loadmodule "kex.so"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "siputils.so"
loadmodule "textops.so"
loadmodule "dispatcher.so"
modparam("dispatcher", "list_file", "$DIR/dispatcher.list")
request_route {
  if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
  if (is_method("CANCEL|ACK") && t_check_trans()) { t_relay(); exit; }
  if (!ds_select_dst("1", "0")) { sl_send_reply("503", "No Destination"); exit; }
  if (is_method("ACK")) { forward(); exit; }
  t_relay();
}
EOF
kamailio -f "$DIR/kamailio.cfg" -DD -E -m 64 -M 8 -P "$DIR/kamailio.pid" >"$DIR/kamailio.log" 2>&1 &
KAM_MAIN=$!
PIDS+=($KAM_MAIN)
for _ in $(seq 1 100); do
  [ "$(pgrep -P "$KAM_MAIN" | wc -l)" -ge 4 ] && break
  sleep 0.1
done
[ "$(pgrep -P "$KAM_MAIN" | wc -l)" -ge 4 ] || { echo "kamailio did not start"; cat "$DIR/kamailio.log"; exit 1; }

# run NAME TARGET PID...: one SIPp run to TARGET; prints one result line.
run() {
  local name=$1 target=$2; shift 2
  local t0 t1 s0 s1 ok failed
  t0=$(ticks "$@"); s0=$(date +%s.%N)
  sipp "$target" -sn uac -i 127.0.0.1 -nostdin -m "$CALLS" -r "$RATE" \
    -recv_timeout 5000 -timeout 120s -trace_stat -fd 1 -stf "$DIR/$name.csv" \
    >"$DIR/$name.log" 2>&1 || true
  s1=$(date +%s.%N); t1=$(ticks "$@")
  read -r ok failed < <(python3 - "$DIR/$name.csv" <<'PY'
import sys
rows = [l.split(";") for l in open(sys.argv[1]) if l.strip()]
h, last = rows[0], rows[-1]
print(last[h.index("SuccessfulCall(C)")], last[h.index("FailedCall(C)")])
PY
)
  python3 - "$name" "$ok" "$failed" "$s0" "$s1" "$t0" "$t1" "$HZ" <<'PY'
import sys
name, ok, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s0, s1, t0, t1, hz = map(float, sys.argv[4:9])
cps = ok / (s1 - s0)
cpu_ms = (t1 - t0) / hz * 1000 / max(ok, 1)
print(f"{name:10} calls_ok={ok} failed={failed} calls_per_s={cps:.0f} cpu_ms_per_call={cpu_ms:.3f}")
PY
}

KAM=($KAM_MAIN $(pgrep -P "$KAM_MAIN"))
echo "offered: $CALLS calls at $RATE/s; $(nproc) cores"
# The machine may be shared: the load average before and after each run.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
P=$(run peerlb-3 "$SIP1" "${PEERLB[@]}")
echo "load average after peerlb-3: $(cut -d' ' -f1-3 /proc/loadavg)"
K=$(run kamailio "127.0.0.1:$KAM_PORT" "${KAM[@]}")
echo "load average after kamailio: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$P"
echo "$K"
python3 - "$P" "$K" <<'PY'
import sys
def f(line, key):
    return float(dict(kv.split("=") for kv in line.split()[1:])[key])
p, k = sys.argv[1], sys.argv[2]
print(f"ratio peerlb-3/kamailio: calls_per_s {f(p,'calls_per_s')/f(k,'calls_per_s'):.2f}, "
      f"cpu_ms_per_call {f(p,'cpu_ms_per_call')/f(k,'cpu_ms_per_call'):.2f}")
PY
