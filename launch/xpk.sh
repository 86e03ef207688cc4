#!/usr/bin/env bash
# Submits a bertjax run to a GKE cluster of Cloud TPU slices as an XPK workload
# (a JobSet that GKE restarts on its own after a preemption).
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

# The xpk this script and its tests are checked against: its workload names,
# its JobSet (restart rules, the command's wrapper) and its dry run.
XPK_VERSION=1.16.0
# xpk runs --command under a bash that forwards SIGTERM to it from a loop that
# sleeps 5 seconds between looks (bash runs a trap once the sleep ends): the run
# hears of a preemption up to this many seconds after the pod did.
XPK_SIGTERM_DELAY=5
# GKE's grace for a spot pod: of the 30 seconds between a spot VM's preemption
# notice and its end, non-system pods get the first 15, whatever their
# terminationGracePeriodSeconds (cloud.google.com/kubernetes-engine/docs/concepts/spot-vms).
SPOT_GRACE=15
# For maintenance on on-demand and reserved TPU nodes GKE follows the pod's
# terminationGracePeriodSeconds (cloud.google.com/kubernetes-engine/docs/concepts/
# handle-disruption-gpu-tpu, which gives its upper limit): what is asked for.
GRACE_ASKED=300

usage() {
  cat <<HELP
Usage: launch/xpk.sh --cluster=CLUSTER --tpu-type=TYPE --image=IMAGE --config=FILE[:ARG] \\
    --workdir=gs://BUCKET/RUN [flags] [-- MAIN_FLAGS...]

Runs python3 -m bertjax.main in the image (launch/Dockerfile) on every host of
--num-slices slices of TYPE, through \`xpk workload create\` (xpk $XPK_VERSION:
pip install xpk==$XPK_VERSION, in a virtual environment of its own, since its pins are
strict). The workload restarts after a failure that a rerun can mend (exit 42,
or a preemption's SIGTERM, after which the run exits 143), up to --max-restarts
times (each preemption uses one), and every restart resumes from the workdir's
checkpoints; an error to mend (exit 2) or a bug (exit 1) ends it. docs/tpu.md
has the whole route, the identity included (launch/gke_setup.sh).

  --cluster CLUSTER       BERTJAX_XPK_CLUSTER       the GKE cluster (xpk cluster create)
  --tpu-type TYPE         BERTJAX_ACCELERATOR_TYPE  v4-32, v5litepod-16, v5p-64, v6e-16, ...
  --num-slices N          slices joined over the data-center network (default 1); the mesh's
                          data axis spans them (bertjax.tools.compile --num_slices=N compiles
                          the same)
  --image IMAGE           BERTJAX_IMAGE             the container (launch/Dockerfile), e.g.
                                                    REGION-docker.pkg.dev/PROJECT/REPO/bertjax:TAG
  --config FILE[:ARG]     the config, e.g. configs/base_pretrain.py (in the image's /app)
  --workdir gs://...      where checkpoints, metrics and the resolved config go
  --workload NAME         the workload's name, as xpk takes it: lower-case letters, digits and
                          '-', a letter first, no '-' last, at most 40 characters (28 where
                          xpk schedules it by super-slicing); default bertjax- and the UTC time
  --max-restarts N        restarts of the whole workload after a failure (default 10); each
                          preemption of any slice uses one (docs/tpu.md: how many to give)
  --spot | --reservation R | --on-demand
                          the capacity (default: the cluster's); give --spot when the
                          cluster's slices are spot VMs, which sets the grace below
  --grace-seconds N       how long GKE lets a stopped pod run after SIGTERM: the pod's
                          terminationGracePeriodSeconds, and, less the up to
                          $XPK_SIGTERM_DELAY seconds xpk's wrapper takes to pass SIGTERM on, what
                          bertjax.main is told (--grace_seconds) to fit a checkpoint into.
                          Default: $SPOT_GRACE with --spot (GKE gives spot pods $SPOT_GRACE seconds
                          whatever the pod asks), else $GRACE_ASKED
  --manifest FILE         also write the JobSet xpk applies to FILE
  --storage NAME          mount storage attached with xpk storage attach (a GCS FUSE bucket, a
                          persistent disk: docs/storage.md) in the workload; repeatable
  --env NAME=VALUE        set a variable in the pods, e.g. BERTJAX_CACHE_DIR=/mnt/disk/cache;
                          repeatable
  --project ID            BERTJAX_PROJECT           Google Cloud project
  --zone ZONE             BERTJAX_ZONE              the cluster's zone
  --check                 submit nothing; check what the workload needs as the account its pods
                          act as: xpk runs them on their node's network (hostNetwork), where
                          Workload Identity does not reach, so they act as their TPU node
                          pools' service account (read from the cluster). Checks that the
                          pools' access scopes let them write to Cloud Storage and that the
                          account can write and delete in --workdir and read --image; one line
                          for each thing missing (acting as the account needs
                          roles/iam.serviceAccountTokenCreator on it: gke_setup.sh grants it).
                          The Compute Engine default account is not acted as (gke_setup.sh
                          lets nobody by default): its role in the bucket's IAM policy is read
                          instead, and the image is read as you
  --node-service-account EMAIL
                          for --check: the pods' service account, instead of reading it from
                          the cluster (its scopes are then not checked)
  --cluster-location L    for --check: the cluster's location (default: the region of --zone,
                          where xpk cluster create makes it)
  --dry-run                                         xpk's own dry run: what it would build and
                                                    apply, nothing submitted (with --check: the
                                                    check's commands)
  --help                                            this text
  -- MAIN_FLAGS...        passed on to bertjax.main, e.g. --config.train.batch_size=512
HELP
}

VALUE_FLAGS+=(--cluster --tpu-type --num-slices --image --config --workdir --workload
              --max-restarts --grace-seconds --reservation --manifest --node-service-account
              --cluster-location --storage --env)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
IMAGE="${BERTJAX_IMAGE:-}" SLICES=1 CONFIG="" WORKDIR=""
WORKLOAD="" MAX_RESTARTS=10 GRACE="" CAPACITY=() MANIFEST="" EXTRA=() CHECK=0 PASSED=()
NODE_SERVICE_ACCOUNT="" CLUSTER_LOCATION=""
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --cluster=*) CLUSTER="${1#*=}" ;;
    --tpu-type=*) ACCELERATOR="${1#*=}" ;;
    --num-slices=*) SLICES="${1#*=}" ;;
    --image=*) IMAGE="${1#*=}" ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --workload=*) WORKLOAD="${1#*=}" ;;
    --max-restarts=*) MAX_RESTARTS="${1#*=}" ;;
    --grace-seconds=*) GRACE="${1#*=}" ;;
    --spot | --on-demand) CAPACITY+=("$1") ;;
    --reservation=*) CAPACITY+=("$1") ;;
    --manifest=*) MANIFEST="${1#*=}" ;;
    --storage=*) PASSED+=("$1") ;;
    --env=*)
      [[ "${1#*=}" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env takes NAME=VALUE, got ${1#*=}"
      PASSED+=("$1") ;;
    --node-service-account=*) NODE_SERVICE_ACCOUNT="${1#*=}" ;;
    --cluster-location=*) CLUSTER_LOCATION="${1#*=}" ;;
    --check) CHECK=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require_cluster
require "$ACCELERATOR" "--tpu-type (or BERTJAX_ACCELERATOR_TYPE)"
require "$IMAGE" "--image (or BERTJAX_IMAGE)"
require "$CONFIG" "--config"
require "$WORKDIR" "--workdir"
[[ "$WORKDIR" == gs://?* ]] || die "--workdir must be a gs:// path that every host can reach"
require_number "$SLICES" --num-slices
(( SLICES >= 1 )) || die "--num-slices must be 1 or more"
require_number "$MAX_RESTARTS" --max-restarts
(( ${#CAPACITY[@]} <= 1 )) || die "choose one of --spot, --reservation and --on-demand"
if [[ -z "$GRACE" ]]; then
  GRACE="$GRACE_ASKED"
  [[ "${CAPACITY[*]:-}" != --spot ]] || GRACE="$SPOT_GRACE"
fi
require_number "$GRACE" --grace-seconds
# What the run has: the grace, less the time xpk's wrapper may take to pass SIGTERM on.
RUN_GRACE=$((GRACE > XPK_SIGTERM_DELAY ? GRACE - XPK_SIGTERM_DELAY : 0))
WORKLOAD="${WORKLOAD:-bertjax-$(date -u +%Y%m%d-%H%M%S)}"
# xpk's own check (parser/validators.py name_type): the pattern, and 40 characters.
if (( ${#WORKLOAD} > 40 )); then
  die "--workload $WORKLOAD has ${#WORKLOAD} characters; xpk takes at most 40"
elif [[ "$WORKLOAD" == *- ]]; then
  die "--workload $WORKLOAD ends in '-'; xpk wants a letter or digit last"
elif ! [[ "$WORKLOAD" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]]; then
  die "--workload takes lower-case letters, digits and '-', a letter first (xpk's" \
    "[a-z]([-a-z0-9]*[a-z0-9])?), got $WORKLOAD"
fi
[[ -z "$NODE_SERVICE_ACCOUNT" || "$NODE_SERVICE_ACCOUNT" == ?*@?* ]] \
  || die "--node-service-account takes the account's e-mail, got $NODE_SERVICE_ACCOUNT"
CLUSTER_LOCATION="${CLUSTER_LOCATION:-${ZONE%-*}}"

# One line for what a failed check says: gcloud's error, and what grants the missing piece.
check_failed() {
  local account="$1" what="$2" fix="$3" errors="$4" error
  error="$(first_error "$errors")"
  if [[ "$error" == *"Failed to impersonate"* || "$error" == *getAccessToken* ]]; then
    fix="you may not act as $account: roles/iam.serviceAccountTokenCreator on it"
    fix+=" (launch/gke_setup.sh --impersonator=YOU grants it)"
  fi
  echo "xpk.sh: --check: $what: ${error:-no error printed}; $fix" >&2
}

# Whether access SCOPES (joined by ';') let a node write to Cloud Storage.
writes_storage() {
  [[ ";$1;" == *"/auth/cloud-platform;"* || ";$1;" == *"/auth/devstorage.full_control;"* \
     || ";$1;" == *"/auth/devstorage.read_write;"* ]]
}

# The bucket's IAM policy, one "ROLE MEMBER" a line.
BUCKET="gs://$(cut -d/ -f3 <<< "$WORKDIR")"
POLICY=(gcloud storage buckets get-iam-policy "$BUCKET" --project="$PROJECT"
        --flatten='bindings[].members' --format='value[separator=" "](bindings.role,bindings.members)')
ACTED=1  # whether --check acted as every account

# check_without_acting ACCOUNT ERRORS: --check for the Compute Engine default
# account, which nobody may act as by default (it usually holds roles/editor
# on the project): its role in the bucket's IAM policy, and the image read as
# you. Returns 1 after a line for each thing missing.
check_without_acting() {
  local account="$1" errors="$2" policy missing=0
  ACTED=0
  echo "xpk.sh: --check: not acting as $account, the Compute Engine default service account" \
    "(launch/gke_setup.sh lets nobody by default): reading its role in $BUCKET's IAM policy" \
    "and the image as you instead (docs/tpu.md: give the TPU nodes an account of their own)" >&2
  if ! policy="$("${POLICY[@]}" 2> "$errors")"; then
    echo "xpk.sh: --check: reading the IAM policy of $BUCKET failed: $(first_error "$errors")" >&2
    missing=1
  elif ! grep -qxF -e "roles/storage.objectAdmin serviceAccount:$account" \
      -e "roles/storage.admin serviceAccount:$account" <<< "$policy"; then
    echo "xpk.sh: --check: $account has no roles/storage.objectAdmin in the IAM policy of" \
      "$BUCKET (launch/gke_setup.sh grants it)" >&2
    missing=1
  fi
  if ! gcloud artifacts docker images describe "$IMAGE" > /dev/null 2> "$errors"; then
    echo "xpk.sh: --check: you cannot read $IMAGE: $(first_error "$errors"); push it" >&2
    missing=1
  fi
  return "$missing"
}

# --check: what the workload will do, done as the account its pods act as
# (impersonated): their TPU node pools' service account, since the pods run on
# the host's network, outside Workload Identity.
preflight() {
  local account name scopes errors missing=0 as
  local object="${WORKDIR%/}/.bertjax-check-$WORKLOAD"
  if [[ -n "$NODE_SERVICE_ACCOUNT" ]]; then
    TPU_POOLS="|$NODE_SERVICE_ACCOUNT|"  # no pool read: its scopes are not known
  else
    tpu_node_pools "$CLUSTER_LOCATION"
  fi
  tpu_node_accounts
  if (( DRY_RUN )); then
    for account in "${NODE_ACCOUNTS[@]}"; do
      if compute_default_account "$account"; then
        run "${POLICY[@]}"
        run gcloud artifacts docker images describe "$IMAGE"
        continue
      fi
      as=(--impersonate-service-account="$account")
      echo "echo bertjax-check | $(printf '%q ' gcloud storage cp - "$object" "${as[@]}" \
        | sed 's/ $//')"
      run gcloud storage rm "$object" "${as[@]}"
      run gcloud artifacts docker images describe "$IMAGE" "${as[@]}"
    done
    return 0
  fi
  while IFS='|' read -r name account scopes; do
    if [[ -n "$name" ]] && ! writes_storage "$scopes"; then
      echo "xpk.sh: --check: node pool $name's access scopes (${scopes:-none}) do not let its" \
        "pods write to Cloud Storage, whatever roles $account has; xpk cluster create gives TPU" \
        "pools storage-full and cloud-platform: make the pool again with those" >&2
      missing=1
    fi
  done <<< "$TPU_POOLS"
  errors="$(mktemp)"
  for account in "${NODE_ACCOUNTS[@]}"; do
    if compute_default_account "$account"; then
      check_without_acting "$account" "$errors" || missing=1
      continue
    fi
    as=(--impersonate-service-account="$account")
    if ! echo bertjax-check | gcloud storage cp - "$object" "${as[@]}" > /dev/null \
        2> "$errors"; then
      check_failed "$account" "$account cannot write to $WORKDIR" \
        "it needs roles/storage.objectAdmin (launch/gke_setup.sh grants it)" "$errors"
      missing=1
    elif ! gcloud storage rm "$object" "${as[@]}" > /dev/null 2> "$errors"; then
      check_failed "$account" "$account cannot delete in $WORKDIR" \
        "it needs roles/storage.objectAdmin (a checkpoint replaces objects)" "$errors"
      missing=1
    fi
    if ! gcloud artifacts docker images describe "$IMAGE" "${as[@]}" > /dev/null \
        2> "$errors"; then
      check_failed "$account" "$account cannot read $IMAGE" \
        "push it, and grant roles/artifactregistry.reader on its repository" "$errors"
      missing=1
    fi
  done
  rm -f "$errors"
  (( ! missing )) || exit 1
  if (( ACTED )); then
    echo "xpk.sh: --check: the pods act as ${NODE_ACCOUNTS[*]} (the service account of their" \
      "TPU node pools: xpk runs them on the host's network), which writes and deletes in" \
      "$WORKDIR and reads $IMAGE"
  else
    echo "xpk.sh: --check: the pods act as ${NODE_ACCOUNTS[*]} (the service account of their" \
      "TPU node pools: xpk runs them on the host's network), which holds a role that writes" \
      "in $BUCKET by its IAM policy; $IMAGE exists"
  fi
}

if (( CHECK )); then
  preflight
  exit 0
fi

COMMAND="python3 -m bertjax.main$(printf ' %q' "--config=$CONFIG" "--workdir=$WORKDIR" \
  "--grace_seconds=$RUN_GRACE" ${EXTRA[@]+"${EXTRA[@]}"})"
# BERTJAX_WORKLOAD names the workload in the workdir's lock. Its restart
# attempt cannot be passed on (xpk writes --env as fixed values; JobSet's
# restart-attempt annotation reaches a container only through the downward
# API), so a restart takes the lock as a new run does (bertjax/workdir_lock.py):
# at once when the attempt before released it, else once it is stale.
XPK=(workload create --cluster="$CLUSTER" --workload="$WORKLOAD" --tpu-type="$ACCELERATOR"
     --num-slices="$SLICES" --docker-image="$IMAGE" --command="$COMMAND"
     --env="BERTJAX_WORKLOAD=$WORKLOAD"
     --max-restarts="$MAX_RESTARTS" --termination-grace-period-seconds="$GRACE"
     --project="$PROJECT" --zone="$ZONE" ${CAPACITY[@]+"${CAPACITY[@]}"}
     ${PASSED[@]+"${PASSED[@]}"})
[[ -z "$MANIFEST" ]] || XPK+=(--output-manifest-file="$MANIFEST")
if (( DRY_RUN )); then
  XPK+=(--dry-run)
  printf '%q ' "${BERTJAX_XPK:-xpk}" "${XPK[@]}" | sed 's/ $//'
  echo
fi
command -v "${BERTJAX_XPK:-xpk}" > /dev/null || die "no xpk here: pip install" \
  "xpk==$XPK_VERSION (in a virtual environment of its own), or set BERTJAX_XPK to its path"
"${BERTJAX_XPK:-xpk}" "${XPK[@]}"
(( DRY_RUN )) || echo "xpk.sh: workload $WORKLOAD submitted to $CLUSTER: xpk workload list" \
  "--cluster=$CLUSTER shows it; its hosts' logs are in Cloud Logging (the link above), its" \
  "metrics in $WORKDIR/metrics.jsonl"
