#!/usr/bin/env bash
# One command for the side-by-side benchmark (docs/performance.md):
#   bench/compare.sh            # full run: 3 rounds, 5 s per measurement, base, moderate load, size and concurrency sweeps, 10 contenders (the key-value pair at 3 points; ~17 min on 2 cores)
#   bench/compare.sh --quick    # base and moderate-load points only, 2 s per measurement (~2 min)
#   bench/compare.sh --before OLD/peerlb   # adds the -before twin of every peerlb contender, same rounds
#   bench/compare.sh --contenders haproxy-kv,peerlb-3-embedded --points kv   # the embedded store against the same store behind HAProxy
#   bench/compare.sh --https    # TLS at every balancer (one certificate): keep-alive points, a new connection per request, HTTP/2 with h2load
#   bench/compare.sh --help     # every option (rounds, duration, contenders, binary, markdown output)
# Needs Debian's haproxy, nginx and wrk: apt-get install -y haproxy nginx wrk
# (--https: openssl, and h2load from nghttp2-client for its HTTP/2 point)
# Not part of CI (.ci/run does not run it).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
for a in "$@"; do
  case "$a" in --help|-h) exec python3 bench/compare.py --help ;; esac
done
missing=()
for t in haproxy nginx wrk python3; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: ${missing[*]} (apt-get install -y haproxy nginx wrk)" >&2
  exit 1
fi
if ! printf '%s\n' "$@" | grep -q -- '^--bin'; then
  log=$(mktemp)
  if ! cargo build --release --bin peerlb >"$log" 2>&1; then cat "$log" >&2; rm -f "$log"; exit 1; fi
  rm -f "$log"
  set -- --bin "$CARGO_TARGET_DIR/release/peerlb" "$@"
fi
# The key-value contenders' store (examples/sharded_cache.rs), unless one is given.
if ! printf '%s\n' "$@" | grep -q -- '^--example'; then
  log=$(mktemp)
  if ! cargo build --release --example sharded_cache >"$log" 2>&1; then cat "$log" >&2; rm -f "$log"; exit 1; fi
  rm -f "$log"
  set -- --example "$CARGO_TARGET_DIR/release/examples/sharded_cache" "$@"
fi
# The hop's floor (the hop-floor contender), unless one is given.
if ! printf '%s\n' "$@" | grep -q -- '^--floor'; then
  set -- --floor "$(bench/floor.sh)" "$@"
fi
exec python3 bench/compare.py "$@"
