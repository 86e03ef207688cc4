# shellcheck shell=bash disable=SC2034  # the variables are read by the scripts that source this
# Shared by the launch scripts (sourced, not run): settings from flags or
# BERTJAX_* environment variables, flag parsing (`--flag=value` or
# `--flag value`), and `run`, which prints the command instead of running it
# under --dry-run. Written for bash 3.2 too (macOS).

PROJECT="${BERTJAX_PROJECT:-}"
ZONE="${BERTJAX_ZONE:-}"
NAME="${BERTJAX_TPU_NAME:-}"
ACCELERATOR="${BERTJAX_ACCELERATOR_TYPE:-}"
RUNTIME="${BERTJAX_RUNTIME_VERSION:-}"
SSH_FLAGS="${BERTJAX_SSH_FLAGS:-}"
CLUSTER="${BERTJAX_XPK_CLUSTER:-}"  # the GKE cluster (xpk.sh, gke_setup.sh)
DRY_RUN=0
# Seconds between two looks at something that takes a while (a queued
# resource, a lost connection); the tests make it short.
POLL_SECONDS="${BERTJAX_POLL_SECONDS:-30}"
# The tildes are the worker's, expanded by its shell.
# shellcheck disable=SC2088
STOP_MARKER="~/bertjax.stop"  # on each worker while stop.sh has stopped the run; a new run removes it
# shellcheck disable=SC2088
WORKER="bash ~/bertjax/launch/worker.sh"  # the worker side (copied there by setup.sh)

COMMON_HELP="Settings (flag, or environment variable; flags take --flag=VALUE or --flag VALUE):
  --project ID            BERTJAX_PROJECT           Google Cloud project
  --zone ZONE             BERTJAX_ZONE              e.g. us-central2-b
  --name NAME             BERTJAX_TPU_NAME          the TPU VM (or pod slice)
  --ssh-flags \"FLAGS\"     BERTJAX_SSH_FLAGS         more flags for gcloud's tpu-vm ssh and scp, e.g.
                                                    --internal-ip (workers created with --internal-ips,
                                                    reached from a VM in their network) or
                                                    --tunnel-through-iap (IAP: run through gcloud's
                                                    alpha track, which has it for TPU VMs)
  --dry-run                                         print the commands, run nothing
  --help                                            this text"

# The flags that take a value: lib.sh's, and each script adds its own.
VALUE_FLAGS=(--project --zone --name --accelerator-type --runtime-version --ssh-flags)

# Rewrites "--flag value" as "--flag=value" (for the flags in VALUE_FLAGS) into
# the array ARGS, so that the scripts match only the second form. Everything
# from "--" on is kept as it is.
normalize_flags() {
  ARGS=()
  while (( $# )); do
    if [[ "$1" == -- ]]; then
      ARGS+=("$@")
      return
    fi
    if [[ " ${VALUE_FLAGS[*]} " == *" $1 "* ]]; then
      (( $# >= 2 )) || die "$1 needs a value"
      ARGS+=("$1=$2")
      shift 2
    else
      ARGS+=("$1")
      shift
    fi
  done
}

# Consumes one common flag; returns 1 if "$1" is not one.
parse_common_flag() {
  case "$1" in
    --project=*) PROJECT="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --name=*) NAME="${1#*=}" ;;
    --accelerator-type=*) ACCELERATOR="${1#*=}" ;;
    --runtime-version=*) RUNTIME="${1#*=}" ;;
    --ssh-flags=*) SSH_FLAGS="${1#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    *) return 1 ;;
  esac
}

# A mistake in how the script was called.
die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# Something went wrong in the cloud.
fail() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# require VALUE "what to set": a clear error when a setting is missing.
require() {
  [[ -n "$1" ]] || die "missing $2"
}

# require_number VALUE FLAG
require_number() {
  [[ "$1" =~ ^[0-9]+$ ]] || die "$2 takes a number, got $1"
}

require_common() {
  require "$PROJECT" "--project (or BERTJAX_PROJECT)"
  require "$ZONE" "--zone (or BERTJAX_ZONE)"
  require "$NAME" "--name (or BERTJAX_TPU_NAME)"
}

# What the GKE scripts (xpk.sh, gke_setup.sh) need.
require_cluster() {
  require "$PROJECT" "--project (or BERTJAX_PROJECT)"
  require "$ZONE" "--zone (or BERTJAX_ZONE)"
  require "$CLUSTER" "--cluster (or BERTJAX_XPK_CLUSTER)"
}

# The common settings as flags, to hand on to another launch script.
common_flags() {
  COMMON=(--project="$PROJECT" --zone="$ZONE" --name="$NAME")
  [[ -z "$SSH_FLAGS" ]] || COMMON+=(--ssh-flags="$SSH_FLAGS")
}

# Runs a command, or prints it (shell-quoted, one line) under --dry-run.
run() {
  if (( DRY_RUN )); then
    printf '%q ' "$@" | sed 's/ $//'
    echo
  else
    "$@"
  fi
}

# How often describe_tpu reads a state before it gives up (waiting
# POLL_SECONDS, then twice and four times that between tries).
DESCRIBE_TRIES=4

# gcloud's error line in a file of its stderr (the first "ERROR: ...", else the
# first line).
first_error() {
  grep -m 1 '^ERROR' "$1" || grep -m 1 . "$1" || true
}

# Waits N times POLL_SECONDS (which may be a fraction: no shell arithmetic on it).
pause() {
  local _
  for _ in $(seq "$1"); do
    sleep "$POLL_SECONDS"
  done
}

# describe_tpu GROUP FIELD: the state of this TPU's tpu-vm or queued-resources
# (GROUP) as `gcloud compute tpus GROUP describe NAME --format=value(FIELD)`
# prints it, in STATE; NOT_FOUND when gcloud answers that the resource does not
# exist (its error "NOT_FOUND: Resource '...' was not found"). Any other failure
# (an expired login, the API out of reach) says nothing about the TPU: the
# describe is tried again, DESCRIBE_TRIES times in all, and if it still fails
# STATE is empty, DESCRIBE_ERROR holds gcloud's error line and it returns 1.
# Nothing may be deleted on a describe that failed.
describe_tpu() {
  local group="$1" field="$2" errors out tries=0
  errors="$(mktemp)"
  STATE="" DESCRIBE_ERROR=""
  while true; do
    if out="$(gcloud compute tpus "$group" describe "$NAME" --zone="$ZONE" --project="$PROJECT" \
        --format="value($field)" 2> "$errors")" && [[ -n "$out" ]]; then
      STATE="$out"
      break
    elif grep -q NOT_FOUND "$errors"; then
      STATE=NOT_FOUND
      break
    fi
    DESCRIBE_ERROR="$(first_error "$errors")"
    DESCRIBE_ERROR="${DESCRIBE_ERROR:-it printed no state}"
    tries=$((tries + 1))
    (( tries < DESCRIBE_TRIES )) || break
    echo "$(basename "$0"): reading the state of $group $NAME failed ($DESCRIBE_ERROR);" \
      "trying again" >&2
    pause $((1 << (tries - 1)))
  done
  rm -f "$errors"
  [[ -n "$STATE" ]]
}

# The gcloud TPU command group with this TPU's zone and project (and the
# --ssh-flags for ssh and scp). `tpu-vm ssh` and `scp` take
# --tunnel-through-iap only in gcloud's alpha track (GA refuses the flag):
# with it, they go through `gcloud alpha`.
tpu() {
  local group="$1" verb="$2" extra=() track=()
  shift 2
  if [[ "$verb" == ssh || "$verb" == scp ]] && [[ -n "$SSH_FLAGS" ]]; then
    # shellcheck disable=SC2206  # the flags are words by design
    extra=($SSH_FLAGS)
    [[ " $SSH_FLAGS " != *" --tunnel-through-iap "* ]] || track=(alpha)
  fi
  run gcloud ${track[@]+"${track[@]}"} compute tpus "$group" "$verb" "$@" \
    ${extra[@]+"${extra[@]}"} --zone="$ZONE" --project="$PROJECT"
}

# tpu_node_pools LOCATION: the TPU node pools of CLUSTER in LOCATION (machine
# types ct* and tpu*, as xpk cluster create makes them), one a line,
# "NAME|ACCOUNT|SCOPES" (SCOPES joined by ';'), in TPU_POOLS. ACCOUNT is the
# pool's Google service account, with gcloud's "default" (a pool created with no
# --service-account, as xpk's are unless given one) written out as the
# project's Compute Engine default account,
# PROJECT_NUMBER-compute@developer.gserviceaccount.com (the number read from
# gcloud unless PROJECT_NUMBER is set). xpk's TPU pods act as that account: they
# run on their node's network (hostNetwork), where GKE's Workload Identity does
# not reach and the Compute Engine metadata server answers. Ends the script,
# saying why, when the pools cannot be listed or there is none. Under
# --dry-run, prints the list and gives one pool, "NODE_POOL|NODE_SERVICE_ACCOUNT|".
tpu_node_pools() {
  local location="$1" errors listed name account scopes
  local list=(gcloud container node-pools list --cluster="$CLUSTER" --location="$location"
              --project="$PROJECT" --filter='config.machineType~^(ct|tpu)'
              --format='value[separator="|"](name,config.serviceAccount,config.oauthScopes)')
  if (( DRY_RUN )); then
    run "${list[@]}"
    TPU_POOLS="NODE_POOL|NODE_SERVICE_ACCOUNT|"
    return
  fi
  errors="$(mktemp)"
  listed="$("${list[@]}" 2> "$errors")" || fail "listing the node pools of cluster $CLUSTER in" \
    "$location failed: $(first_error "$errors")"
  rm -f "$errors"
  [[ -n "$listed" ]] || fail "cluster $CLUSTER has no TPU node pools in $location (xpk cluster" \
    "create makes them); give the pods' service account with --node-service-account"
  TPU_POOLS=""
  while IFS='|' read -r name account scopes; do
    if [[ -z "$account" || "$account" == default ]]; then
      if [[ -z "${PROJECT_NUMBER:-}" ]]; then
        PROJECT_NUMBER="$(gcloud projects describe "$PROJECT" --format='value(projectNumber)')" \
          || fail "reading the number of project $PROJECT failed (above)"
      fi
      [[ "$PROJECT_NUMBER" =~ ^[0-9]+$ ]] \
        || fail "gcloud gave no number for project $PROJECT: give --project-number"
      account="$PROJECT_NUMBER-compute@developer.gserviceaccount.com"
    fi
    TPU_POOLS+="$name|$account|$scopes"$'\n'
  done <<< "$listed"
}

# The accounts of TPU_POOLS, each once, into NODE_ACCOUNTS.
tpu_node_accounts() {
  local name account scopes
  NODE_ACCOUNTS=()
  while IFS='|' read -r name account scopes; do
    [[ -n "$account" ]] || continue
    [[ " ${NODE_ACCOUNTS[*]-} " == *" $account "* ]] || NODE_ACCOUNTS+=("$account")
  done <<< "$TPU_POOLS"
}

# Whether EMAIL is a project's Compute Engine default service account
# (PROJECT_NUMBER-compute@developer.gserviceaccount.com), which usually holds
# roles/editor on its project: nobody is let act as it by default.
compute_default_account() {
  [[ "$1" =~ ^[0-9]+-compute@developer\.gserviceaccount\.com$ ]]
}
