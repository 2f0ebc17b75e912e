#!/usr/bin/env bash
# Issue 31 in one command on a lent GPU machine, in under 8 minutes: install the carried wheels, run
# scripts/gpu_check.py's checks and benchmarks/bench_gpu.py, write $OUT/gpu_run.json and $OUT/gpu_run.log.
#
#   here, once:   bash scripts/fetch_gpu_wheels.sh            # .whl/ (ignored by git, about 20 MB)
#   device tool:  run(command="bash scripts/gpu_run.sh", carry=[".whl"], timeout_s=540)
#   dry run here: OUT=/tmp/gpu_out PYTHON=.venv/bin/python bash scripts/gpu_run.sh   # no CUDA: checks SKIP, --tiny
#
# Each stage has its own time limit (CHECK_LIMIT, BENCH_LIMIT seconds) so the whole stays inside 8 minutes; both
# write their JSON as they go, so a stage stopped by its limit still reports what it measured. Missing wheels are not
# fatal: the checks that need a missing package print SKIP and say why. The exit status is 0 only when no check
# FAILed and the benchmark raised nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$(mktemp -d /tmp/gpu_run.XXXXXX)}
PY=${PYTHON:-python3}
WHEELS=${GPU_RUN_WHEELS:-.whl}
SITE=${GPU_RUN_SITE:-/tmp/gpu_run_site}
CHECK_LIMIT=${CHECK_LIMIT:-200}
BENCH_LIMIT=${BENCH_LIMIT:-240}
WORK=$(mktemp -d /tmp/gpu_run_work.XXXXXX)
mkdir -p "$OUT"
LOG=$OUT/gpu_run.log
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor   # the three compiled runners share one cache within the run

stage() {  # name, limit, command...: runs it, logs its status and seconds to $WORK/stages
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start))s$([ $rc = 124 ] && echo ' (stopped at its time limit)')"
    echo "$name $rc $((SECONDS - start))" >>"$WORK/stages"
    return 0
}

main() {
    echo "gpu_run.sh $(date -u +%FT%TZ) on $(hostname), repo $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        stage install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$WHEELS"/*.whl
        export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "=== install: no wheels in $WHEELS (scripts/fetch_gpu_wheels.sh makes them): using what is installed"
    fi
    local cuda
    cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
    if [ "$cuda" = 1 ]; then
        export DS_ACCELERATOR=cuda  # the DeepSpeed wheel is built on a CPU machine: name the accelerator
        bench_args=()
    else
        echo "no CUDA device: a dry run (the CUDA checks SKIP, the benchmark runs --tiny)"
        bench_args=(--tiny)
    fi
    stage checks "$CHECK_LIMIT" "$PY" scripts/gpu_check.py --json "$WORK/checks.json"
    # shellcheck disable=SC2086 - GPU_RUN_BENCH_ARGS: extra flags, split on spaces (e.g. "--batch 16 --compile off")
    stage bench "$BENCH_LIMIT" "$PY" benchmarks/bench_gpu.py "${bench_args[@]}" ${GPU_RUN_BENCH_ARGS:-} --json "$WORK/bench.json"
    "$PY" - "$WORK" "$OUT/gpu_run.json" "$cuda" <<'EOF'
import json, os, sys
work, target, cuda = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def load(name):
    try:
        with open(os.path.join(work, name)) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        return {"missing": f"{name}: {error}"}
stages = {}
with open(os.path.join(work, "stages")) as f:
    for line in f:
        name, rc, seconds = line.split()
        stages[name] = {"exit": int(rc), "seconds": int(seconds), "timed_out": rc in ("124", "137")}
checks, bench = load("checks.json"), load("bench.json")
counts = {}
for c in checks.get("checks", []):
    counts[c["status"]] = counts.get(c["status"], 0) + 1
summary = {"cuda": cuda, "stages": stages, "check_counts": counts,
           "failed_checks": [c["name"] for c in checks.get("checks", []) if c["status"] == "FAIL"],
           "bench_errors": bench.get("errors", ["no benchmark result"] if "missing" in bench else []),
           "bench_ratios": bench.get("ratios", [])}
with open(target, "w") as f:
    json.dump({"summary": summary, "checks": checks, "bench": bench}, f, indent=1)
print("summary: " + json.dumps(summary))
ok = (not summary["failed_checks"] and not summary["bench_errors"]
      and all(s["exit"] == 0 for s in stages.values()))
sys.exit(0 if ok else 1)
EOF
}

main 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
echo "gpu_run.sh: exit $rc; $OUT/gpu_run.json and $OUT/gpu_run.log" | tee -a "$LOG"
exit "$rc"
