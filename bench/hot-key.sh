#!/usr/bin/env bash
# The hot-key figures of docs/performance.md ("Bounded load under a hot
# key"): simulations/hot-key.toml (3 nodes, half the requests on one key,
# a 50 ms app) with `hash_balance_factor = 1.25` and without it, on seeds
# 1..SEEDS (default 5): requests served per node, and the samples (every
# 50 ms) in which the busiest node's requests in flight passed
# 1.25 x mean + 1. Deterministic: the same seeds give the same figures.
#   bench/hot-key.sh [SEEDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seeds=${1:-5}
sim="$root/simulations/peerlb-sim"
"$sim" --help >/dev/null
bin="${SIM_TARGET_DIR:-$root/target-sim}/sim/peerlb-sim"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$root/simulations/hot-key.toml" "$tmp/bounded.toml"
# The same load with no bound: the cluster text without the factor, and no
# served-balance check (it cannot hold).
sed -e '/^hash_balance_factor/d' -e '/^served_factor/d' \
  "$root/simulations/hot-key.toml" > "$tmp/unbounded.toml"
for file in unbounded bounded; do
  for seed in $(seq 1 "$seeds"); do
    out=$("$bin" "$tmp/$file.toml" --seed "$seed")
    served=$(sed -n 's/^served per node: //p' <<<"$out")
    over=$(sed -n 's/^in flight: the busiest node above the bound in \(.*\) samples (\(.*\))$/\1 (\2)/p' <<<"$out")
    printf '%-9s seed %-2s served %-24s in-flight over 1.25 x mean + 1: %s\n' "$file" "$seed" "$served" "$over"
  done
done
