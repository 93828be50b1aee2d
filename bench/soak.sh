#!/usr/bin/env bash
# Soak: steady load (wrk) into a 3-node loopback cluster whose owners are
# killed (SIGKILL) and restarted in turn; prints errors and RSS every minute.
# Goal: 0 failed requests (every request is a replayable GET), RSS flat.
#   bench/soak.sh                       # 30 minutes on the release build
#   bench/soak.sh --minutes 5           # shorter
#   bench/soak.sh --bin target/debug/peerlb --minutes 5
#   bench/soak.sh --help                # every option
# Needs Debian's wrk (apt-get install -y wrk). Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
for a in "$@"; do
  case "$a" in --help|-h) exec python3 bench/soak.py --help ;; esac
done
command -v wrk >/dev/null 2>&1 || { echo "missing: wrk (apt-get install -y wrk)" >&2; exit 1; }
if ! printf '%s\n' "$@" | grep -q -- '^--bin'; then
  log=$(mktemp)
  if ! cargo build --release --bin peerlb >"$log" 2>&1; then cat "$log" >&2; rm -f "$log"; exit 1; fi
  rm -f "$log"
  set -- --bin "$CARGO_TARGET_DIR/release/peerlb" "$@"
fi
exec python3 bench/soak.py "$@"
