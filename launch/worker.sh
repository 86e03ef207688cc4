#!/usr/bin/env bash
# The worker side of run.sh and logs.sh: runs on each TPU worker (setup.sh
# copies it there with the checkout), where it starts a bertjax run detached
# from the SSH session, follows its log and reports how it ended.
set -euo pipefail

LOGS="$HOME/bertjax-logs"
VENV="$HOME/bertjax-venv"
STOP_MARKER="$HOME/bertjax.stop"
CHECKOUT="$(cd "$(dirname "$0")/.." && pwd)"
HOST="$(hostname)"
# This boot of the host: a pid recorded in an earlier one names another process.
BOOT_ID="$(cat "${BERTJAX_BOOT_ID_FILE:-/proc/sys/kernel/random/boot_id}" 2>/dev/null || true)"
# How long a resumed run waits for the other hosts to join (seconds): one of
# them may be restarting (minutes).
REJOIN_TIMEOUT_S="${BERTJAX_REJOIN_TIMEOUT_S:-1800}"

usage() {
  cat <<HELP
Usage: launch/worker.sh COMMAND RUN_ID [ARGS...]

Runs on a TPU worker, called over SSH by run.sh and logs.sh (nothing to run
from your own machine). A run's files are in ~/bertjax-logs/: RUN_ID.log (its
output), RUN_ID.pid (the shell that runs it) and, once it has ended,
RUN_ID.status (its exit status); "latest" holds the last RUN_ID started. RUN_ID
may be "latest". The log and how the run ended are copied into the run's
workdir as they come (WORKDIR/logs/RUN_ID/HOST.log and HOST.json, by
bertjax.tools.ship_log), where launch/logs.sh --workdir reads them.

A run resumes by itself after a restart of a host of the slice (a maintenance
event), unless launch/stop.sh stopped it: on a host that goes on, a run that
stopped to be resumed (exit 143: the restarting host's SIGTERM reached every
host's training loop, which saved a checkpoint) starts again at once and waits
for the other hosts; on the restarted host, the slice's startup script
(launch/startup.sh) calls "worker.sh boot", which starts it again.

  start RUN_ID [MAIN_FLAGS...]  starts ~/bertjax-venv/bin/python -m bertjax.main MAIN_FLAGS in
                                ~/bertjax, in a session of its own (setsid nohup) so that it
                                goes on when the SSH connection drops, and returns; refuses
                                while the latest run is still going
  follow RUN_ID [LINES]         prints the log (from line LINES as tail -n takes it; default +1,
                                the start), each line prefixed with the host name, until the
                                run ends; exits with the run's status
  state RUN_ID                  prints "HOST: running", "HOST: exited STATUS" or
                                "HOST: ended without an exit status"
  log RUN_ID                    prints the whole log
  boot                          at boot, as the user who started it: starts the latest run again
                                if this host's restart cut it off (it had not ended, or ended
                                with 143, and was not stopped)
  --help                        this text
HELP
}

say() {
  echo "$HOST: $*"
}

# The run's id (RUN_ID, or the latest one); exits if there is no such run here.
resolve() {
  local id="$1"
  [[ "$id" != latest ]] || id="$(cat "$LOGS/latest" 2>/dev/null || true)"
  if [[ -z "$id" || ! -e "$LOGS/$id.pid" ]]; then
    say "no bertjax run $1 here" >&2
    exit 3
  fi
  echo "$id"
}

# Whether run $1 is still going: no exit status yet, and its shell is alive
# (in this boot of the host: after a restart, its pid may be another process's;
# a run that recorded no boot, started by an earlier worker.sh, is taken as of
# this one).
alive() {
  [[ ! -e "$LOGS/$1.status" ]] && kill -0 "$(cat "$LOGS/$1.pid")" 2>/dev/null \
    && { [[ ! -e "$LOGS/$1.boot" ]] || [[ "$(cat "$LOGS/$1.boot")" == "$BOOT_ID" ]]; }
}

# Waits (10 s at most) for run $1's shell to record its pid; fails, saying so, if it does not.
started() {
  for _ in $(seq 100); do
    [[ ! -s "$LOGS/$1.pid" ]] || return 0
    sleep 0.1
  done
  say "run $1 did not start; see $LOGS/$1.log" >&2
  return 1
}

start() {
  local id="$1" latest
  shift
  mkdir -p "$LOGS"
  if [[ -e "$LOGS/$id.pid" ]]; then
    say "run $id was started already"  # gcloud repeats a command whose connection failed
    return 0
  fi
  latest="$(cat "$LOGS/latest" 2>/dev/null || true)"
  if [[ -n "$latest" && -e "$LOGS/$latest.pid" ]] && alive "$latest"; then
    say "run $latest is still going; launch/stop.sh stops it" >&2
    exit 3
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    say "there is no $VENV; run launch/setup.sh first" >&2
    exit 3
  fi
  rm -f "$STOP_MARKER"
  echo "$id" > "$LOGS/latest"
  printf '%s\0' "$@" > "$LOGS/$id.args"  # for a restart of this host (boot)
  # A session of its own: no hangup reaches it when the SSH session ends.
  setsid nohup bash "$CHECKOUT/launch/worker.sh" _run "$id" "$@" \
    > "$LOGS/$id.log" 2>&1 < /dev/null &
  started "$id" || exit 3
  say "started run $id (pid $(cat "$LOGS/$id.pid"), log $LOGS/$id.log)"
}

# The detached shell around the run: it records its pid, runs the command and
# records the exit status (written whole, then renamed, so no reader sees half).
# A run that stopped to be resumed (143) while this host goes on, and that
# stop.sh did not stop, is started again at once: another host of the slice is
# restarting, and the run waits (REJOIN_TIMEOUT_S) for it to join. A SIGTERM to
# this shell means this host is going down: the run is left to its boot.
# Whether the log's last line was cut (the run killed as it wrote it): the next
# line is then started on a line of its own, the cut one kept as it is.
cut_line() {
  [[ -s "$1" && -n "$(tail -c 1 "$1")" ]]
}

_run() {
  local id="$1" status=0 workdir="" arg timeout=() attempt=1
  shift
  TERMINATED=0
  trap 'TERMINATED=1' TERM
  echo "$BOOT_ID" > "$LOGS/$id.boot"
  echo $$ > "$LOGS/$id.pid.part" && mv "$LOGS/$id.pid.part" "$LOGS/$id.pid"
  for arg in "$@"; do
    [[ "$arg" != --workdir=* ]] || workdir="${arg#--workdir=}"
  done
  if [[ -n "$workdir" ]]; then
    # The log, and how the run ended, also go to the workdir as they are written
    # (WORKDIR/logs/RUN_ID/HOST.log and .json): they outlive this worker's disk.
    # A resumed run's copy goes on from what the workdir holds already.
    # (From the checkout, as the run: a ~/bertjax beside it is not the package.)
    (cd "$CHECKOUT" && exec "$VENV/bin/python" -m bertjax.tools.ship_log \
      --log="$LOGS/$id.log" --to="${workdir%/}/logs/$id/$HOST" --until_pid=$$ \
      --status_file="$LOGS/$id.status") >> "$LOGS/$id.ship.log" 2>&1 < /dev/null &
  fi
  [[ -z "${BERTJAX_RESUMED:-}" ]] || timeout=(--initialization_timeout_s="$REJOIN_TIMEOUT_S")
  cd "$CHECKOUT"
  while true; do
    echo "worker.sh: run $id on $HOST from $(date -u +%FT%TZ): python -m bertjax.main $*"
    status=0
    PYTHONUNBUFFERED=1 "$VENV/bin/python" -m bertjax.main "$@" ${timeout[@]+"${timeout[@]}"} \
      || status=$?  # lines as they come
    ! cut_line "$LOGS/$id.log" || echo  # (this shell's output is the log)
    echo "worker.sh: run $id on $HOST ended $(date -u +%FT%TZ) with exit status $status"
    (( status == 143 && ! TERMINATED )) && [[ ! -e "$STOP_MARKER" ]] || break
    attempt=$((attempt + 1))
    echo "worker.sh: run $id stopped to be resumed while $HOST goes on (another host of the" \
      "slice restarting?): starting it again (attempt $attempt), waiting up to" \
      "${REJOIN_TIMEOUT_S}s for every host"
    timeout=(--initialization_timeout_s="$REJOIN_TIMEOUT_S")
  done
  echo "$status" > "$LOGS/$id.status.part" && mv "$LOGS/$id.status.part" "$LOGS/$id.status"
}

# At boot (launch/startup.sh, as the user who started the run): the latest run
# starts again, in its log, if this host's restart cut it off. One that ended
# (0, an error, a stop.sh) stays as it is.
boot() {
  local id status
  id="$(cat "$LOGS/latest" 2>/dev/null || true)"
  if [[ -z "$id" || ! -e "$LOGS/$id.args" ]]; then
    say "no bertjax run to resume"
    return 0
  fi
  if [[ -e "$STOP_MARKER" ]]; then
    say "run $id was stopped (launch/stop.sh): not resuming it"
    return 0
  fi
  if alive "$id"; then
    say "run $id is going"
    return 0
  fi
  status="$(cat "$LOGS/$id.status" 2>/dev/null || echo none)"
  if [[ "$status" != none && "$status" != 143 ]]; then
    say "run $id ended with exit status $status: nothing to resume"
    return 0
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    say "run $id cannot resume: there is no $VENV" >&2
    return 3
  fi
  local args=()
  while IFS= read -r -d '' arg; do args+=("$arg"); done < "$LOGS/$id.args"
  rm -f "$LOGS/$id.status" "$LOGS/$id.pid"
  ! cut_line "$LOGS/$id.log" || echo >> "$LOGS/$id.log"  # the host went down mid-line
  echo "worker.sh: $HOST started again $(date -u +%FT%TZ): resuming run $id" >> "$LOGS/$id.log"
  BERTJAX_RESUMED=1 setsid nohup bash "$CHECKOUT/launch/worker.sh" _run "$id" \
    ${args[@]+"${args[@]}"} >> "$LOGS/$id.log" 2>&1 < /dev/null &
  started "$id" || return 3
  say "resumed run $id (pid $(cat "$LOGS/$id.pid"), log $LOGS/$id.log)"
}

follow() {
  local id lines="${2:-+1}"
  id="$(resolve "$1")"
  # Ends when the run's shell has gone (after it wrote the status).
  tail -n "$lines" -F --pid="$(cat "$LOGS/$id.pid")" "$LOGS/$id.log" | sed -u "s/^/$HOST: /"
  if [[ -e "$LOGS/$id.status" ]]; then
    exit "$(cat "$LOGS/$id.status")"
  fi
  say "run $id ended without an exit status (its shell was killed)" >&2
  exit 1
}

state() {
  local id
  id="$(resolve "$1")"
  if [[ -e "$LOGS/$id.status" ]]; then
    say "exited $(cat "$LOGS/$id.status")"
  elif alive "$id"; then
    say running
  else
    say "ended without an exit status"
  fi
}

log() {
  local id
  id="$(resolve "$1")"
  cat "$LOGS/$id.log"
}

case "${1:-}" in
  --help) usage ;;
  boot) boot ;;
  start | follow | state | log | _run)
    (( $# >= 2 )) || { echo "worker.sh: $1 needs a RUN_ID (see --help)" >&2; exit 2; }
    command="$1"
    shift
    "$command" "$@" ;;
  *) echo "worker.sh: unknown command ${1:-} (see --help)" >&2; exit 2 ;;
esac
