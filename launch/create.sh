#!/usr/bin/env bash
# Creates a Cloud TPU VM or pod slice (directly, or as a queued resource that
# it waits for).
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/create.sh [flags] [-- GCLOUD_FLAGS...]

Creates the TPU VM or pod slice NAME (every host of a slice is a worker).
A queued resource is waited for until it is ACTIVE (the TPU is then READY); a
request of that name still in the queue is waited for, not replaced.

  --accelerator-type TYPE BERTJAX_ACCELERATOR_TYPE  v4-8, v4-32, v5litepod-16, v5p-64, v6e-16, ...
  --runtime-version V     BERTJAX_RUNTIME_VERSION   TPU software version; by default the one
                                                    Google documents for the generation:
                                                    v4: tpu-ubuntu2204-base,
                                                    v5litepod (v5e): v2-alpha-tpuv5-lite,
                                                    v5p: v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e
  --queued                request it as a queued resource (waits in Google's queue for capacity)
  --wait-timeout SECONDS  how long to wait for the queued resource to become ACTIVE (default
                          3600); every BERTJAX_POLL_SECONDS (default 30) its state is read
  --spot                  spot capacity (cheaper; can be preempted at any time)
  --preemptible           preemptible capacity (direct creation only)
  --reserved              capacity from a reservation of the project
  --internal-ips          no external IP addresses for the workers (then give the other scripts
                          --ssh-flags=--internal-ip from a VM in the same network, or
                          --ssh-flags=--tunnel-through-iap; setup.sh needs Cloud NAT, or
                          --wheelhouse)
  --no-startup-script     leave out launch/startup.sh, which every worker runs at boot to resume
                          the run that a restart of the host cut off (set by default, in the
                          TPU's metadata as startup-script)
  -- GCLOUD_FLAGS...      passed on to gcloud as they are, e.g. -- --network=NET --subnetwork=SUB
$COMMON_HELP
HELP
}

# The runtime version Google documents for JAX on each TPU generation
# (cloud.google.com/tpu/docs/runtimes).
default_runtime() {
  case "$1" in
    v4-*) echo tpu-ubuntu2204-base ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    *) return 1 ;;
  esac
}

# Polls the queued resource until it is ACTIVE; fails on a state it cannot
# leave by itself, or after WAIT_TIMEOUT seconds.
wait_until_active() {
  local deadline=$((SECONDS + WAIT_TIMEOUT)) state last=""
  if (( DRY_RUN )); then
    tpu queued-resources describe "$NAME" --format='value(state.state)'
    return 0
  fi
  while true; do
    state="$(tpu queued-resources describe "$NAME" --format='value(state.state)')" \
      || state="unknown (describe failed)"
    if [[ "$state" != "$last" ]]; then
      echo "create.sh: queued resource $NAME is $state" >&2
      last="$state"
    fi
    case "$state" in
      ACTIVE) return 0 ;;
      FAILED | SUSPENDING | SUSPENDED | DELETING)
        fail "queued resource $NAME is $state, it will not become ACTIVE (see gcloud compute" \
          "tpus queued-resources describe $NAME --zone=$ZONE --project=$PROJECT; delete.sh" \
          "--queued removes it)" ;;
    esac
    (( SECONDS < deadline )) || fail "queued resource $NAME is still $state after" \
      "${WAIT_TIMEOUT}s (--wait-timeout); it stays in the queue: wait with gcloud compute tpus" \
      "queued-resources describe $NAME, or delete.sh --queued"
    sleep "$POLL_SECONDS"
  done
}

VALUE_FLAGS+=(--wait-timeout)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
QUEUED=0 WAIT_TIMEOUT=3600 CAPACITY=() NETWORK=() EXTRA=()
STARTUP=(--metadata-from-file="startup-script=$(cd "$(dirname "$0")" && pwd)/startup.sh")
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --queued) QUEUED=1 ;;
    --wait-timeout=*) WAIT_TIMEOUT="${1#*=}" ;;
    --spot | --preemptible | --reserved) CAPACITY+=("$1") ;;
    --internal-ips) NETWORK+=(--internal-ips) ;;
    --no-startup-script) STARTUP=() ;;
    --) shift; EXTRA=("$@"); break ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require_common
require "$ACCELERATOR" "--accelerator-type (or BERTJAX_ACCELERATOR_TYPE)"
if [[ -z "$RUNTIME" ]]; then
  RUNTIME="$(default_runtime "$ACCELERATOR")" || die "no default runtime version for" \
    "$ACCELERATOR (known: v4, v5litepod, v5p, v6e); give --runtime-version"
fi
require_number "$WAIT_TIMEOUT" --wait-timeout
(( ${#CAPACITY[@]} <= 1 )) || die "choose one of --spot, --preemptible and --reserved"
FLAGS=(${CAPACITY[@]+"${CAPACITY[@]}"} ${NETWORK[@]+"${NETWORK[@]}"}
       ${STARTUP[@]+"${STARTUP[@]}"} ${EXTRA[@]+"${EXTRA[@]}"})

if (( QUEUED )); then
  [[ "${CAPACITY[*]:-}" != --preemptible ]] || die "queued resources take --spot, not --preemptible"
  # A request of this name still in the queue (an earlier create.sh gave up
  # waiting) is waited for, not replaced: a new one would start at the back.
  existing=NOT_FOUND
  if (( ! DRY_RUN )); then
    describe_tpu queued-resources state.state || fail "the state of queued resource $NAME" \
      "could not be read ($DESCRIBE_ERROR); nothing created"
    existing="$STATE"
  fi
  case "$existing" in
    NOT_FOUND)
      tpu queued-resources create "$NAME" --node-id="$NAME" --accelerator-type="$ACCELERATOR" \
        --runtime-version="$RUNTIME" ${FLAGS[@]+"${FLAGS[@]}"} ;;
    ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING | CREATING | ACTIVE)
      echo "create.sh: queued resource $NAME is requested already ($existing): waiting for it" \
        "(its place in the queue is kept)" >&2 ;;
    *)
      fail "queued resource $NAME exists and is $existing; delete it first (delete.sh --queued)" ;;
  esac
  wait_until_active
else
  tpu tpu-vm create "$NAME" --accelerator-type="$ACCELERATOR" --version="$RUNTIME" \
    ${FLAGS[@]+"${FLAGS[@]}"}
fi
