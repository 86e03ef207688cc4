#!/usr/bin/env bash
# Runs python -m bertjax.main on every worker at once, detached from this
# terminal, and follows it (restarting it after a preemption) or returns.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/run.sh --config=FILE[:ARG] --workdir=gs://BUCKET/RUN [flags] [-- MAIN_FLAGS...]

Starts ~/bertjax-venv/bin/python -m bertjax.main on every worker (JAX finds the
other hosts itself), each in a session of its own: the run goes on when this
terminal or its SSH connections go. Each worker keeps its output in
~/bertjax-logs/RUN_ID.log and, when the run ends, its exit status in
RUN_ID.status (launch/logs.sh reads both). Then run.sh follows every
worker's log, each line prefixed with the worker's host name, until the run
ends (following again when the connection drops) and exits with the run's
status; or, with --detach, returns at once. A run resumes from the
checkpoints in its workdir, so rerunning this command after a preemption
continues it. After stop.sh, --restarts does not start it again.

  --config FILE[:ARG]     the config, e.g. configs/base_pretrain.py
  --workdir gs://...      where checkpoints and metrics go (every worker writes there)
  --run-id ID             names the run's files on the workers (default: the UTC time, and
                          -N for the Nth restart)
  --detach                start the run and return; follow it with logs.sh --follow. With
                          --restarts or --delete-when-done, run.sh itself goes on in the
                          background (its log: ~/.bertjax/launch/NAME-RUN_ID.log) to restart
                          and delete as it would in the foreground
  --restarts N            after a failure, check the TPU; if it was preempted (or is gone),
                          delete and recreate it (create.sh with --create-flags, which waits
                          for a queued resource, and keeps one still waiting in the queue)
                          and set it up again (setup.sh); then rerun; at most N times
                          (default 0). A run that ended on an error to mend (exit 2) or was
                          interrupted (130) is not rerun. The TPU counts as gone only when
                          gcloud says so (NOT_FOUND, PREEMPTED, TERMINATED, DELETING): when
                          its state cannot be read, nothing is deleted, and a recreated TPU
                          whose setup failed is set up again, not deleted. A TPU still
                          being made (CREATING, its queued request ACCEPTED,
                          WAITING_FOR_RESOURCES or PROVISIONING: create.sh failed or gave up)
                          is waited for, up to create.sh's --wait-timeout, then set up
  --create-flags "..."    flags for create.sh when recreating, e.g. "--queued --spot
                          --accelerator-type=v4-32"
  --delete-when-done      delete the TPU (its queued resource, if it has one) once the run has
                          ended successfully, and only then: an idle slice bills as a busy one
  -- MAIN_FLAGS...        passed on, e.g. --config.train.batch_size=512
$COMMON_HELP
HELP
}

VALUE_FLAGS+=(--config --workdir --run-id --restarts --create-flags)
ORIGINAL=("$@")  # for a supervisor run in the background (--detach with --restarts)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
CONFIG="" WORKDIR="" RUN_NAME="" DETACH=0 RESTARTS=0 CREATE_FLAGS="" DELETE_WHEN_DONE=0 EXTRA=()
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --run-id=*) RUN_NAME="${1#*=}" ;;
    --detach) DETACH=1 ;;
    --restarts=*) RESTARTS="${1#*=}" ;;
    --create-flags=*) CREATE_FLAGS="${1#*=}" ;;
    --delete-when-done) DELETE_WHEN_DONE=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require_common
require "$CONFIG" "--config"
require "$WORKDIR" "--workdir"
[[ "$WORKDIR" == gs://* ]] || die "--workdir must be a gs:// path that every worker can reach"
require_number "$RESTARTS" --restarts
[[ "$RUN_NAME" =~ ^[A-Za-z0-9._-]*$ ]] || die "--run-id takes letters, digits, '.', '_' and '-'"
RUN_NAME="${RUN_NAME:-$(date -u +%Y%m%dT%H%M%SZ)}"

MAIN_ARGS="$(printf ' %q' "--config=$CONFIG" "--workdir=$WORKDIR" ${EXTRA[@]+"${EXTRA[@]}"})"

# --detach with what needs watching (--restarts, --delete-when-done): this
# script goes on in the background, in a session of its own with its own log,
# so that closing this terminal does not end the supervision. Start it from a
# machine that stays on (a small VM), not a laptop that sleeps.
if (( DETACH && (RESTARTS > 0 || DELETE_WHEN_DONE) )); then
  SUPERVISOR_LOGS="${BERTJAX_LAUNCH_LOGS:-$HOME/.bertjax/launch}"
  SUPERVISOR_LOG="$SUPERVISOR_LOGS/$NAME-$RUN_NAME.log"
  ARGS=(--run-id="$RUN_NAME")  # the same run id (a later --run-id is this one)
  rest=0
  for arg in ${ORIGINAL[@]+"${ORIGINAL[@]}"}; do
    [[ "$arg" != -- ]] || rest=1
    (( rest )) || [[ "$arg" != --detach ]] || continue
    ARGS+=("$arg")
  done
  run mkdir -p "$SUPERVISOR_LOGS"
  if (( DRY_RUN )); then
    run setsid nohup bash "$0" ${ARGS[@]+"${ARGS[@]}"}
    exit 0
  fi
  rm -f "$SUPERVISOR_LOG"
  BERTJAX_SUPERVISOR=1 setsid nohup bash "$0" ${ARGS[@]+"${ARGS[@]}"} > "$SUPERVISOR_LOG" 2>&1 \
    < /dev/null &
  # Returns once the supervisor has its own session (its first line says so):
  # a terminal closed at once then cannot take it along.
  for _ in $(seq 100); do
    [[ ! -s "$SUPERVISOR_LOG" ]] || break
    sleep 0.1
  done
  [[ -s "$SUPERVISOR_LOG" ]] || fail "the supervisor did not start; see $SUPERVISOR_LOG"
  echo "run.sh: supervising run $RUN_NAME of $NAME in the background (pid $!, log" \
    "$SUPERVISOR_LOG); launch/logs.sh --follow follows the run, launch/stop.sh stops it" >&2
  exit 0
fi
if [[ -n "${BERTJAX_SUPERVISOR:-}" ]]; then
  echo "run.sh: supervising run $RUN_NAME of $NAME from $(hostname), pid $$, since" \
    "$(date -u +%FT%TZ)"
fi
HERE="$(dirname "$0")"
common_flags

# Follows the run on every worker until it ends; returns its exit status. When
# following fails, asks the workers: the run may have ended (the status they
# recorded) or only the connection (follow it again). Returns the follow's
# status when the workers cannot say.
follow_run() {
  local status states code
  tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER follow $RUN_ID +1" && return 0
  status=$?
  while true; do
    states="$(tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER state $RUN_ID" \
      2>/dev/null)" || true
    if [[ "$states" == *": running"* ]]; then
      echo "run.sh: following stopped ($status) while run $RUN_ID goes on on the workers (a" \
        "dropped connection?); following it again" >&2
      sleep "$POLL_SECONDS"
      tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER follow $RUN_ID 20" && return 0
      status=$?
    elif [[ -n "$states" && "$states" != *"without an exit status"* ]]; then
      # Every worker recorded one: the first that is not 0, or 0.
      code="$(sed -n 's/.*: exited \([0-9]*\)$/\1/p' <<< "$states" | grep -v '^0$' | head -n 1)"
      return "${code:-0}"
    else
      return "$status"
    fi
  done
}

# Deletes the TPU once the run has succeeded: its queued resource when it has
# one (which deletes the TPU with it), else the TPU VM.
delete_when_done() {
  local queued=()
  if (( ! DRY_RUN )); then
    describe_tpu queued-resources name || fail "run $RUN_ID succeeded, but whether $NAME is a" \
      "queued resource could not be read ($DESCRIBE_ERROR): delete it with launch/delete.sh" \
      "(--queued if it is one)"
    [[ "$STATE" == NOT_FOUND ]] || queued=(--queued)
  fi
  local dry=()
  (( ! DRY_RUN )) || dry=(--dry-run)
  "$HERE/delete.sh" "${COMMON[@]}" ${queued[@]+"${queued[@]}"} ${dry[@]+"${dry[@]}"} \
    || fail "run $RUN_ID succeeded, but deleting $NAME failed: delete it with launch/delete.sh"
  (( DRY_RUN )) || echo "run.sh: run $RUN_ID succeeded; deleted $NAME (--delete-when-done)" >&2
}

# Deletes the TPU and creates it again (setting it up is the caller's). A
# queued request still waiting in the queue (an earlier recreation gave up
# waiting for it) is kept: create.sh waits for it, in its place. When the
# request's state cannot be read, nothing is deleted: the recreation fails and
# is tried again later.
recreate_tpu() {
  local queued=() state=""
  if [[ " $CREATE_FLAGS " == *" --queued "* ]]; then
    queued=(--queued)
    if ! describe_tpu queued-resources state.state; then
      echo "run.sh: the state of queued resource $NAME could not be read ($DESCRIBE_ERROR);" \
        "deleting nothing" >&2
      return 1
    fi
    state="$STATE"
  fi
  case "$state" in
    ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING | CREATING)
      echo "run.sh: queued resource $NAME is still $state: waiting for it" >&2 ;;
    *) "$HERE/delete.sh" "${COMMON[@]}" ${queued[@]+"${queued[@]}"} --if-exists || true ;;
  esac
  # shellcheck disable=SC2086  # the flags are words by design
  "$HERE/create.sh" "${COMMON[@]}" $CREATE_FLAGS
}

# How long an attempt waits for a TPU still being made before it sets it up:
# create.sh's --wait-timeout when --create-flags gives one, else its default.
WAIT_TIMEOUT=3600
if [[ " $CREATE_FLAGS " =~ \ --wait-timeout[=\ ]([0-9]+)\  ]]; then
  WAIT_TIMEOUT="${BASH_REMATCH[1]}"
fi

# Waits, before setting the TPU up, while it is still being made (create.sh
# failed or gave up while its queued request was ACCEPTED,
# WAITING_FOR_RESOURCES or PROVISIONING, or the TPU CREATING): its state is
# read every POLL_SECONDS, up to WAIT_TIMEOUT seconds, all within one
# attempt. Returns 1 if it is still being made then; 0 once it is not (or its
# state cannot be read: setting it up finds out).
wait_while_made() {
  local deadline=$((SECONDS + WAIT_TIMEOUT)) what last=""
  while true; do
    what=""
    if [[ " $CREATE_FLAGS " == *" --queued "* ]]; then
      describe_tpu queued-resources state.state || return 0
      case "$STATE" in
        ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING | CREATING)
          what="queued resource $NAME is $STATE" ;;
      esac
    fi
    if [[ -z "$what" ]]; then
      describe_tpu tpu-vm state || return 0
      [[ "$STATE" != CREATING ]] || what="$NAME is CREATING"
    fi
    [[ -n "$what" ]] || return 0
    if (( SECONDS >= deadline )); then
      echo "run.sh: still waiting after ${WAIT_TIMEOUT}s (--wait-timeout): $what; not" \
        "setting it up yet" >&2
      return 1
    fi
    [[ "$what" == "$last" ]] || echo "run.sh: $what: waiting for it before setting it up" >&2
    last="$what"
    sleep "$POLL_SECONDS"
  done
}

# bertjax.main's exit statuses that decide what comes next (0 is done; 143 a
# SIGTERM, after a checkpoint when the grace allowed: rerun, it resumes).
USAGE_ERROR=2  # a setting, file, data or workdir to mend: a rerun ends the same way
RESTARTABLE=42  # storage out of reach, a lock not yet free, a lost host: a rerun can cure it
INTERRUPTED=130  # Ctrl-C (after a checkpoint): somebody stopped it
# recreate: the describe after the last failure said the TPU is gone, so the
# next attempt deletes and recreates it (and only that attempt: each decides
# from its own describe, never from an earlier one's). set_up: a recreation
# began and its TPU is not set up yet (create.sh or setup.sh failed); an
# attempt that finds the TPU up, or cannot read its state, sets it up again
# and deletes nothing. being_made: that describe found the TPU CREATING, so the
# next attempt waits for it (wait_while_made) before setting it up.
attempt=0 recreate=0 set_up=0 resumed=0 being_made=0
while true; do
  status=0
  if (( recreate )); then
    recreate=0 set_up=1
    recreate_tpu || status=$?
  fi
  if (( being_made )); then
    being_made=0
    wait_while_made || status=$?
  fi
  if (( status == 0 && set_up )); then
    "$HERE/setup.sh" "${COMMON[@]}" || status=$?
    (( status )) || set_up=0
  fi
  if (( status )); then
    echo "run.sh: recreating or setting up the TPU failed ($status)" >&2
  fi
  if (( status == 0 && resumed )); then
    resumed=0
    follow_run || status=$?
  elif (( status == 0 )); then
    RUN_ID="$RUN_NAME"
    (( attempt == 0 )) || RUN_ID="$RUN_NAME-$attempt"
    tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER start $RUN_ID$MAIN_ARGS" || status=$?
    if (( status != 0 )); then
      echo "run.sh: starting run $RUN_ID failed ($status)" >&2
    elif (( DETACH )); then
      echo "run.sh: run $RUN_ID goes on on every worker of $NAME: launch/logs.sh --follow" \
        "follows it, launch/stop.sh stops it" >&2
      exit 0
    else
      follow_run || status=$?
    fi
  fi
  if (( status == 0 )); then
    (( ! DELETE_WHEN_DONE )) || delete_when_done
    exit 0
  fi
  if (( status == USAGE_ERROR )); then
    # A setting to change (the run's last line says which): a rerun ends the same way.
    (( RESTARTS == 0 )) || echo "run.sh: the run stopped on an error to mend (exit 2, its" \
      "last line says what); not rerunning it" >&2
    exit "$status"
  elif (( status == INTERRUPTED )); then
    (( RESTARTS == 0 )) || echo "run.sh: the run was interrupted (Ctrl-C, exit 130); not" \
      "rerunning it" >&2
    exit "$status"
  elif (( status == RESTARTABLE && RESTARTS > 0 )); then
    echo "run.sh: the run stopped on a failure a restart can cure (exit 42: its last line" \
      "says which)" >&2
  fi
  if (( attempt >= RESTARTS )); then
    (( RESTARTS == 0 )) || echo "run.sh: giving up after $RESTARTS restarts ($status)" >&2
    exit "$status"
  fi
  attempt=$((attempt + 1))
  if describe_tpu tpu-vm state; then
    echo "run.sh: the run failed ($status); the TPU is $STATE" >&2
  else
    # An expired login or an API outage: the TPU may be up and running. A
    # rerun finds out (and, if it fails, uses one of the restarts).
    echo "run.sh: the run failed ($status); the TPU's state could not be read" \
      "($DESCRIBE_ERROR); deleting nothing, running it again" >&2
  fi
  # Gone: a NOT_FOUND, a preempted or terminated slice, one being deleted.
  # Only a describe that says so recreates it: a TPU that an earlier
  # recreation made, and whose setup failed, is set up again, not deleted.
  if [[ " NOT_FOUND PREEMPTED TERMINATED DELETING " == *" $STATE "* ]]; then
    [[ -n "$CREATE_FLAGS" ]] || die "the TPU is $STATE; give --create-flags to recreate it"
    recreate=1
  elif [[ "$STATE" == CREATING ]]; then
    # Still being made (create.sh failed or gave up waiting): waited for, then set up.
    set_up=1 being_made=1
    echo "run.sh: $NAME is CREATING: waiting for it, then setting it up (deleting nothing)" >&2
  elif (( set_up )); then
    echo "run.sh: $NAME, recreated, is not set up yet: setting it up again (deleting nothing)" >&2
  elif tpu tpu-vm ssh "$NAME" --worker=0 --command="test -e $STOP_MARKER" 2>/dev/null; then
    echo "run.sh: the run was stopped with stop.sh; not rerunning it" >&2
    exit "$status"
  elif tpu tpu-vm ssh "$NAME" --worker=all --command="$WORKER state $RUN_ID" 2>/dev/null \
      | grep -q ': running$'; then
    # A restarted host's startup script (or the workers themselves) resumed it.
    echo "run.sh: run $RUN_ID goes on again on the workers (resumed after a restart of a" \
      "host); following it" >&2
    resumed=1 attempt=$((attempt - 1))
  fi
done
