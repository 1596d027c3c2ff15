#!/usr/bin/env bash
# The two-player games' runs: each tuned example, for each seed, trained alone for
# MINUTES (default 60) with its eval suites measured along the way
# (bench_train_cpu.py --suites), then its checkpoint evaluated on EVAL_STATES
# states (default 1000) of each suite opponent, both seats, with every turn kept;
# for Kuhn Poker the strategy played is scored exactly against the Nash strategy
# (bench/kuhn_strategy.py).
#
#   bash bench/game_runs.sh OUT SEED... -- EXAMPLE.yaml...
#   bash bench/game_runs.sh /data/games 0 1 2 -- tuned_examples/kuhn_poker_selfplay_smollm2_cpu.yaml \
#       tuned_examples/kuhn_poker_smollm2_cpu.yaml
#
# Per run, OUT/<example>_s<seed>/ holds train.log and figures.json (bench_train_cpu),
# ckpt/, eval.json and turns.parquet (rllib evaluate) and, for Kuhn Poker,
# strategy.json. `rllib report` on the run folder that train.log names draws its
# curves. THREADS=1 lets two of these share a 2-core machine (torch threads per run).
# CONFIG (a JSON object) is merged into every run's config, e.g.
# CONFIG='{"lr": 1e-4, "kl_coeff": 0.1}'; TAG names such runs apart in OUT
# (OUT/<example>_<TAG>_s<seed>/).
set -euo pipefail
out=${1:?usage: game_runs.sh OUT SEED... -- EXAMPLE.yaml...}
shift
seeds=()
while [[ $# -gt 0 && $1 != "--" ]]; do seeds+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
[[ ${#seeds[@]} -gt 0 && $# -gt 0 ]] || { echo "give seeds, then -- and the examples" >&2; exit 2; }
minutes=${MINUTES:-60}
states=${EVAL_STATES:-1000}
threads=${THREADS:-0}
extra=${CONFIG:-"{}"}
here=$(cd "$(dirname "$0")" && pwd)
for example in "$@"; do
  name=$(basename "$example" .yaml)
  suite=$(python - "$example" <<'PY'
import sys, yaml
exp = next(iter(yaml.safe_load(open(sys.argv[1])).values()))
print(" ".join(exp["config"].get("eval_suites") or []))
PY
)
  for seed in "${seeds[@]}"; do
    dir="$out/${name}${TAG:+_$TAG}_s$seed"
    mkdir -p "$dir"
    echo "== $name seed $seed -> $dir"
    # (its own line: under set -e a bad CONFIG stops the script here)
    config=$(python -c 'import json, sys; print(json.dumps({**json.loads(sys.argv[1]), "seed": int(sys.argv[2])}))' "$extra" "$seed")
    python "$here/bench_train_cpu.py" "$example" --minutes "$minutes" --suites --threads "$threads" \
      --config "$config" --json "$dir/figures.json" --checkpoint "$dir/ckpt" \
      > "$dir/train.log" 2>&1
    args=()
    for s in $suite; do args+=(--suite "$s"); done
    rllib evaluate "$dir/ckpt" "${args[@]}" --num-states "$states" \
      --output "$dir/eval.json" --trajectories "$dir/turns.parquet" > "$dir/eval.log" 2>&1
    if [[ $suite == *kuhn_poker* ]]; then
      python "$here/kuhn_strategy.py" "$dir/turns.parquet" > "$dir/strategy.json"
    fi
  done
done
