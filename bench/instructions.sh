#!/usr/bin/env bash
# Instructions per request of one peerlb node, counted by valgrind's
# callgrind: a figure a loaded, shared machine does not move (CPU seconds
# per request move by 10-20 % between rounds on one; instruction counts
# repeat to within 0.2 %). User space only: the kernel's share (sockets,
# wakeups) is not counted, so this judges a change to peerlb's own code,
# not the whole path (bench/compare.sh does that).
#
#   bench/instructions.sh [BIN ...]      # each binary, the paths below
#   N=4000 bench/instructions.sh BIN     # more requests per measurement
#   bench/instructions.sh --haproxy [BIN ...]   # and HAProxy, for scale
#   PATHS=hop bench/instructions.sh BIN  # only some of the paths below
#   FLOOR= bench/instructions.sh BIN     # without the floor's figures
#   KEEP=DIR bench/instructions.sh BIN   # keeps each callgrind profile in DIR
#                                        # (callgrind_annotate DIR/hop.4000.1)
#   CONNS=128 bench/instructions.sh BIN  # the counted requests on 128
#                                        # connections at once (N a multiple)
#
# Two paths, each on one keep-alive connection (a Python client that sends
# a request, reads its whole answer, sends the next: no pipelining; with
# CONNS, that many such connections at once, so the figure is the cost
# per request at that concurrency under saturation):
#   local  one node, `app` upstream = a `peerlb app` backend: the entry is
#          the owner; the node's instructions per request.
#   hop    two nodes with the built-in app, the entry's weight 0 so every
#          request is forwarded over the QUIC hop: the entry's
#          instructions per forwarded request.
#   owner  the same two nodes: the owner's instructions per forwarded
#          request.
# Then the hop's floor (benches/hop_floor.rs, built by bench/floor.sh
# unless FLOOR names its binary): its entry's and its owner's
# instructions per forwarded request, the scale for the hop and owner
# figures (`floor` and `floor-owner` below; FLOOR= leaves them out).
# With --haproxy, HAProxy (one thread, Debian's haproxy) in front of the
# same backend as `local`, configured as bench/compare.sh's contender
# (consistent hash on `user`, pooled keep-alive): HAProxy's instructions
# per request, the scale for the figures above.
# Each path is measured twice, with N and 2N requests after a warm-up, and
# the figure is (Ir(2N) - Ir(N)) / N, so the node's fixed cost over the
# measurement (gossip rounds, timers: they scale with wall time, which
# valgrind stretches) cancels out. Gossip runs every 2 s here, not every
# 200 ms: its rounds scale with wall time, which a busy machine stretches
# under valgrind, and at the default they moved the hop figure by up to
# 10 % between runs.
#
# Needs valgrind and python3 (apt-get install -y valgrind). Not part of CI.
# Ports 127.0.0.1:23001-23312. Default BIN: target/release/peerlb (built).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install -y valgrind)" >&2; exit 1; }
N=${N:-2000}
haproxy=false
if [ "${1:-}" = --haproxy ]; then
  haproxy=true
  shift
  command -v haproxy >/dev/null || { echo "haproxy is missing (apt-get install -y haproxy)" >&2; exit 1; }
fi
if [ $# -eq 0 ]; then
  cargo build --release --bin peerlb >/dev/null 2>&1 || cargo build --release --bin peerlb
  set -- target/release/peerlb
fi
if [ -z "${FLOOR+set}" ]; then
  FLOOR=$(bench/floor.sh)
fi
work=$(mktemp -d /tmp/peerlb-instr-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

cat >"$work/client.py" <<'EOF'
import socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
conns = int(sys.argv[3]) if len(sys.argv) > 3 else 1
def request(i):
    return b"GET /bytes/200?user=u%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % (i % 10000)
def body_length(head):
    """The answer's Content-Length; exits on an answer that is not 200."""
    if not head.startswith(b"HTTP/1.1 200"):
        sys.exit("unexpected answer: " + head[:60].decode(errors="replace"))
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
if conns > 1:
    # CONNS connections at once, each a closed loop like the one below:
    # the node (slowed by valgrind) finds up to CONNS requests ready per
    # wakeup, as a saturated node does at that concurrency.
    import asyncio
    async def one(k, share):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for i in range(share):
            w.write(request(k * share + i))
            head = await r.readuntil(b"\r\n\r\n")
            await r.readexactly(body_length(head))
        w.close()
    async def main():
        await asyncio.gather(*(one(k, n // conns) for k in range(conns)))
    asyncio.run(main())
    sys.exit(0)
s = socket.create_connection(("127.0.0.1", port))
buf = b""
for i in range(n):
    s.sendall(request(i))
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("connection closed")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = body_length(head + b"\r\n")
    while len(rest) < length:
        rest += s.recv(65536)
    buf = rest[length:]
EOF

cat >"$work/local.toml" <<EOF
name = "instr-local"
app = "builtin"
[gossip]
interval_ms = 2000
[tls]
dir = "$work/certs-local"
[[nodes]]
id = "l1"
http_addr = "127.0.0.1:23001"
peer_addr = "127.0.0.1:23011"
gossip_addr = "127.0.0.1:23021"
[[rules]]
name = "user"
extract = [{ query = "user" }]
EOF
cat >"$work/hop.toml" <<EOF
name = "instr-hop"
app = "builtin"
[gossip]
interval_ms = 2000
[tls]
dir = "$work/certs-hop"
[[nodes]]
id = "h1"
http_addr = "127.0.0.1:23201"
peer_addr = "127.0.0.1:23211"
gossip_addr = "127.0.0.1:23221"
weight = 0
[[nodes]]
id = "h2"
http_addr = "127.0.0.1:23202"
peer_addr = "127.0.0.1:23212"
gossip_addr = "127.0.0.1:23222"
[[rules]]
name = "user"
extract = [{ query = "user" }]
EOF

cat >"$work/haproxy.cfg" <<EOF
global
    maxconn 4096
    nbthread 1
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 30s
    option http-keep-alive
    http-reuse always
frontend fe
    bind 127.0.0.1:23050
    default_backend apps
backend apps
    balance url_param user
    hash-type consistent
    server app1 127.0.0.1:23100
EOF

wait_http() { # port
  for _ in $(seq 600); do
    python3 "$work/client.py" 1 "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "no answer on port $1" >&2
  return 1
}

# measure BIN PATH COUNT -> total Ir of the node under callgrind over COUNT requests
measure() {
  local bin=$1 path=$2 count=$3 out="$work/cg.$2.$3" others=() node port
  if [ "$path" = floor ] || [ "$path" = floor-owner ]; then
    "$bin" certs "$work/certs-floor"
    if [ "$path" = floor ]; then
      "$bin" owner "$work/certs-floor" 127.0.0.1:23312 >/dev/null 2>&1 &
      others+=($!)
      valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" entry "$work/certs-floor" \
        127.0.0.1:23301 127.0.0.1:23312 >"$work/node.log" 2>&1 &
      node=$!
    else
      valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" owner "$work/certs-floor" \
        127.0.0.1:23312 >"$work/node.log" 2>&1 &
      node=$!
      "$bin" entry "$work/certs-floor" 127.0.0.1:23301 127.0.0.1:23312 >/dev/null 2>&1 &
      others+=($!)
    fi
    port=23301
  elif [ "$path" = haproxy ]; then
    "$bin" app --listen 127.0.0.1:23100 --name app1 >/dev/null 2>&1 &
    others+=($!)
    valgrind --tool=callgrind --callgrind-out-file="$out" haproxy -f "$work/haproxy.cfg" -db \
      >"$work/node.log" 2>&1 &
    node=$! port=23050
  elif [ "$path" = local ]; then
    "$bin" certs --config "$work/local.toml" >/dev/null 2>&1
    "$bin" app --listen 127.0.0.1:23100 --name app1 >/dev/null 2>&1 &
    others+=($!)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" node --config "$work/local.toml" \
      --node l1 --app http://127.0.0.1:23100 >"$work/node.log" 2>&1 &
    node=$! port=23001
  elif [ "$path" = hop ]; then
    "$bin" certs --config "$work/hop.toml" >/dev/null 2>&1
    "$bin" node --config "$work/hop.toml" --node h2 >/dev/null 2>&1 &
    others+=($!)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" node --config "$work/hop.toml" \
      --node h1 >"$work/node.log" 2>&1 &
    node=$! port=23201
  else
    "$bin" certs --config "$work/hop.toml" >/dev/null 2>&1
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" node --config "$work/hop.toml" \
      --node h2 >"$work/node.log" 2>&1 &
    node=$!
    "$bin" node --config "$work/hop.toml" --node h1 >/dev/null 2>&1 &
    others+=($!)
    port=23201
  fi
  wait_http $port
  if [ "$path" = hop ] || [ "$path" = owner ]; then
    # The entry serves itself until its connection to the owner is up.
    for _ in $(seq 600); do
      curl -s -D - -o /dev/null "http://127.0.0.1:$port/bytes/1?user=w" | grep -qi '^peerlb-served-by: h2' && break
      sleep 0.2
    done
  fi
  python3 "$work/client.py" 300 $port
  callgrind_control -z $node >/dev/null 2>&1
  python3 "$work/client.py" "$count" $port "${CONNS:-1}"
  callgrind_control -d $node >/dev/null 2>&1
  kill $node "${others[@]}" 2>/dev/null || true
  wait $node "${others[@]}" 2>/dev/null || true
  # The dump on demand is part 1; its totals line is the counted interval.
  awk '/^totals:/ {print $2}' "$out".1
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out".1 "$KEEP/$path.$count.1"
  fi
  rm -f "$out" "$out".*
}

printf '%-40s %-6s %14s\n' binary path "Ir/request"
for bin in "$@"; do
  for path in ${PATHS:-local hop owner}; do
    a=$(measure "$bin" $path "$N")
    b=$(measure "$bin" $path $((2 * N)))
    printf '%-40s %-6s %14s\n' "$bin" $path $(((b - a) / N))
  done
done
if [ -n "$FLOOR" ]; then
  for path in floor floor-owner; do
    a=$(measure "$FLOOR" $path "$N")
    b=$(measure "$FLOOR" $path $((2 * N)))
    label=hop
    [ $path = floor-owner ] && label=owner
    printf '%-40s %-6s %14s\n' hop-floor $label $(((b - a) / N))
  done
fi
if $haproxy; then
  a=$(measure "$1" haproxy "$N")
  b=$(measure "$1" haproxy $((2 * N)))
  printf '%-40s %-6s %14s\n' haproxy local $(((b - a) / N))
fi
