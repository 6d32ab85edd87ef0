#!/usr/bin/env bash
# The grid behind results/ on the tiny pair: Table 1 (single models, AdaFuse and the baselines on
# all six tasks, one fixed slice per task for every method) and the ablation sweeps of τΔ, B, M and
# fixed-length commitment on NQ and GSM8K. Every run is a SLURM job on the local cluster, through
# Hydra's submitit launcher; the multiruns are submitted together and this script waits for all.
#
#   bash slurm/cluster.sh start && bash scripts/run_grid.sh    # hours on two CPU cores
#   LIMIT=2 bash scripts/run_grid.sh                           # every job on 2 examples: a check
#   LIMIT=2 EXTRA="task.max_new_tokens=8" bash scripts/run_grid.sh   # a quicker one (EXTRA enters the run ids)
#   METHODS="single adafuse" bash scripts/run_grid.sh          # a subset of the methods
#   PARTS=table bash scripts/run_grid.sh                       # Table 1's runs only (PARTS=sweeps: the ablations)
#   SWEEP_TASKS=nq bash scripts/run_grid.sh                    # the ablations on NQ only (default: nq gsm8k)
#   SWEEP_LIMIT=50 TAUS=0.3,0.9 BRANCHES=1,5 bash scripts/run_grid.sh   # shorter, sparser sweeps
#   JOB_CPUS=2 bash scripts/run_grid.sh                        # one job at a time, leaving a core free
#   python scripts/make_table.py results/grid && python scripts/make_figures.py results/grid
#
# Runs resume: rerunning the script (or one line of it) decodes only what is missing. A larger
# slice later grows the same run directories. Sweep logs go to multirun/grid/<date>/<time>/<n>/.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
METHODS=${METHODS:-"single adafuse unite sweetspan deepen llm_blender"}
QA_LIMIT=${LIMIT:-${QA_LIMIT:-100}}  # NQ, TriviaQA, SQuAD
GEN_LIMIT=${LIMIT:-${GEN_LIMIT:-50}}  # GSM8K, FLORES En->De and De->En
QA=nq,triviaqa,squad
GEN=gsm8k,flores_en_de,flores_de_en
PARTS=${PARTS:-"table sweeps"}
SWEEP_TASKS=${SWEEP_TASKS:-"nq gsm8k"}
# The values each sweep adds to the default run (τΔ 0.7, B 3, M 3, adaptive), its middle point.
TAUS=${TAUS:-0.1,0.3,0.5,0.9}
BRANCHES=${BRANCHES:-1,2,4,5}
MAX_WORDS=${MAX_WORDS:-1,2,4}
FIXED_WORDS=${FIXED_WORDS:-1,2,3}
RESULTS=${RESULTS:-results/grid}  # apart from results/<task>/..., where ordinary runs go

# Two CPUs: two one-CPU jobs at a time, one torch thread each, 4 GB each (the pair peaks near 3 GB).
LAUNCHER=(
    hydra/launcher=slurm
    hydra.launcher.gpus_per_node=null
    hydra.launcher.cpus_per_task=${JOB_CPUS:-1}
    hydra.launcher.mem_gb=4
    hydra.launcher.timeout_min=720
    threads=1
    results_dir="$RESULTS"
    wandb.mode=disabled
    progress=false
)

# A method is usable once conf/method/<name>.yaml exists; the others are dropped with a note.
available=()
for method in $METHODS; do
    if [ -f "conf/method/$method.yaml" ]; then available+=("$method"); else echo "grid: no method $method yet, skipped" >&2; fi
done
ensembles=$(printf '%s\n' "${available[@]}" | grep -vx single | paste -sd, || true)

pids=()
stamp=$(date +%Y-%m-%d/%H-%M-%S)
multirun() { # a Hydra multirun in the background, with a sweep folder of its own; its log names each job's run directory
    # shellcheck disable=SC2086  # EXTRA is a list of overrides
    "$PYTHON" run.py -m "${LAUNCHER[@]}" hydra.sweep.dir="multirun/grid/$stamp/${#pids[@]}" "$@" ${EXTRA:-} &
    pids+=($!)
}

for slice in "$QA $QA_LIMIT" "$GEN $GEN_LIMIT"; do
    [[ " $PARTS " == *" table "* ]] || break
    read -r tasks limit <<<"$slice"
    if [[ " ${available[*]} " == *" single "* ]]; then
        multirun method=single method.member=0,1 task="$tasks" task.limit="$limit"
    fi
    if [ -n "$ensembles" ]; then
        multirun method="$ensembles" task="$tasks" task.limit="$limit"
    fi
done

if [[ " ${available[*]} " == *" adafuse "* && " $PARTS " == *" sweeps "* ]]; then
    for task in $SWEEP_TASKS; do
        case $task in nq | triviaqa | squad) limit=$QA_LIMIT ;; *) limit=$GEN_LIMIT ;; esac
        # A shorter SWEEP_LIMIT compares every point, the default run's too, on the first examples
        # (scripts/make_figures.py scores a sweep on the examples all its points decoded).
        limit=${SWEEP_LIMIT:-$limit}
        multirun method=adafuse task="$task" task.limit="$limit" method.tau="$TAUS"
        multirun method=adafuse task="$task" task.limit="$limit" method.branches="$BRANCHES"
        multirun method=adafuse task="$task" task.limit="$limit" method.max_words="$MAX_WORDS"
        multirun method=adafuse task="$task" task.limit="$limit" method.fixed_words="$FIXED_WORDS"
    done
fi

failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
if [ "$failed" -gt 0 ]; then
    echo "grid: $failed multiruns failed; their logs are above and in multirun/" >&2
    exit 1
fi
echo "grid: done. Next: $PYTHON scripts/make_table.py $RESULTS && $PYTHON scripts/make_figures.py $RESULTS"
