#!/usr/bin/env bash
# Builds the hop's floor (benches/hop_floor.rs, release) and prints the
# path of its binary: the `hop-floor` contender of bench/compare.py and
# the floor's figures in bench/instructions.sh and bench/syscalls.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! cargo build --release --bench hop_floor --message-format=json >"$log.json" 2>"$log"; then
  cat "$log" >&2
  rm -f "$log.json"
  exit 1
fi
python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "hop_floor" and m.get("executable"):
        print(m["executable"])
' "$log.json"
rm -f "$log.json"
