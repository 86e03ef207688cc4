#!/usr/bin/env bash
# Runs python -m bertjax.main on every worker at once, keeping each worker's log.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/run.sh --config=FILE[:ARG] --workdir=gs://BUCKET/RUN [flags] [-- MAIN_FLAGS...]

Starts the same command on every worker (JAX finds the other hosts itself).
Each worker's output goes to logs/NAME/<time>/ (gcloud --output-directory)
and is followed on the terminal. A run resumes from the checkpoints in its
workdir, so rerunning this command after a preemption continues it.
After stop.sh, --restarts does not start it again.

  --config=FILE[:ARG]     the config, e.g. configs/base_pretrain.py
  --workdir=gs://...      where checkpoints and metrics go (every worker writes there)
  --restarts=N            after a failure, check the TPU; if it was preempted,
                          recreate it (create.sh with --create-flags) and set it up again,
                          then rerun; at most N times (default 0)
  --create-flags="..."    flags for create.sh when recreating (e.g. "--queued --spot
                          --accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base")
  -- MAIN_FLAGS...        passed on, e.g. --config.train.batch_size=512
$COMMON_HELP
HELP
}

CONFIG="" WORKDIR="" RESTARTS=0 CREATE_FLAGS="" EXTRA=()
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --restarts=*) RESTARTS="${1#*=}" ;;
    --create-flags=*) CREATE_FLAGS="${1#*=}" ;;
    --) shift; EXTRA=("$@"); break ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require_common
require "$CONFIG" "--config"
require "$WORKDIR" "--workdir"
[[ "$WORKDIR" == gs://* ]] || die "--workdir must be a gs:// path that every worker can reach"
[[ "$RESTARTS" =~ ^[0-9]+$ ]] || die "--restarts takes a number, got $RESTARTS"

MAIN_ARGS="$(printf ' %q' "--config=$CONFIG" "--workdir=$WORKDIR" ${EXTRA[@]+"${EXTRA[@]}"})"
REMOTE="rm -f $STOP_MARKER && cd ~/bertjax && python3 -m bertjax.main$MAIN_ARGS"
HERE="$(dirname "$0")"
COMMON=(--project="$PROJECT" --zone="$ZONE" --name="$NAME")

attempt=0
while true; do
  LOGS="logs/$NAME/$(date -u +%Y%m%dT%H%M%SZ)"
  run mkdir -p "$LOGS"
  if (( ! DRY_RUN )); then
    # Follow the workers' logs once gcloud has created them.
    (for _ in $(seq 120); do
       compgen -G "$LOGS/*" > /dev/null && exec tail -n +1 -F "$LOGS"/*
       sleep 1
     done) &
    FOLLOW=$!
  fi
  status=0
  tpu tpu-vm ssh "$NAME" --worker=all --command="$REMOTE" --output-directory="$LOGS" || status=$?
  if (( ! DRY_RUN )); then kill "$FOLLOW" 2>/dev/null || true; fi
  (( status != 0 )) || exit 0
  (( attempt < RESTARTS )) || exit "$status"
  attempt=$((attempt + 1))
  state="$(gcloud compute tpus tpu-vm describe "$NAME" --zone="$ZONE" --project="$PROJECT" \
    --format='value(state)' 2>/dev/null || echo MISSING)"
  echo "run.sh: the run failed ($status); the TPU is $state" >&2
  if [[ "$state" == PREEMPTED || "$state" == MISSING ]]; then
    [[ -n "$CREATE_FLAGS" ]] || die "the TPU is $state; give --create-flags to recreate it"
    QUEUED=()
    [[ " $CREATE_FLAGS " == *" --queued "* ]] && QUEUED=(--queued)
    "$HERE/delete.sh" "${COMMON[@]}" ${QUEUED[@]+"${QUEUED[@]}"} --if-exists || true
    # shellcheck disable=SC2086  # the flags are words by design
    "$HERE/create.sh" "${COMMON[@]}" $CREATE_FLAGS
    "$HERE/setup.sh" "${COMMON[@]}"
  elif tpu tpu-vm ssh "$NAME" --worker=0 --command="test -e $STOP_MARKER" 2>/dev/null; then
    echo "run.sh: the run was stopped with stop.sh; not rerunning it" >&2
    exit "$status"
  fi
done
