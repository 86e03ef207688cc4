#!/usr/bin/env bash
# The cloud identity of bertjax's GKE workloads (launch/xpk.sh): the service
# account of the cluster's TPU node pools, which xpk's pods act as, what it may
# touch, and the image repository.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/gke_setup.sh --project=ID --zone=ZONE --cluster=CLUSTER --bucket=gs://BUCKET [flags]

Gives bertjax's XPK workloads what they need, once per project and cluster. xpk runs
TPU pods on their node's network (hostNetwork: true), where GKE's Workload Identity does
not reach: their credentials come from the Compute Engine metadata server, so they act
as the Google service account of their node pool. This
  1. enables the APIs (Artifact Registry, GKE, IAM and its credentials, Storage, TPU);
  2. creates the Docker repository REPO in Artifact Registry, unless it exists;
  3. finds the service account of the cluster's TPU node pools (gcloud container node-pools
     list): xpk cluster create gives them none of their own, so they run as the Compute
     Engine default service account, PROJECT_NUMBER-compute@developer.gserviceaccount.com,
     unless it was given --custom-nodepool-arguments=--service-account=EMAIL;
  4. grants that account roles/storage.objectAdmin on the bucket (checkpoints, metrics,
     logs, the workdir's lock) and roles/artifactregistry.reader on REPO (the nodes pull
     the image with it too);
  5. lets you (the active gcloud account, or --impersonator) act as it, for
     launch/xpk.sh --check (roles/iam.serviceAccountTokenCreator on it), unless it is
     the Compute Engine default account, which usually holds roles/editor on the
     project: that takes --impersonator=MEMBER, and is better left out by giving the
     TPU nodes an account of their own (docs/tpu.md);
  6. lets docker push to the repository: gcloud auth configure-docker REGION-docker.pkg.dev.

  --bucket gs://BUCKET    the bucket of the runs' workdirs (a path in it is fine)
  --cluster CLUSTER       BERTJAX_XPK_CLUSTER       the GKE cluster (xpk cluster create)
  --cluster-location L    the cluster's location (default: the region of --zone, where xpk
                          cluster create makes it)
  --region REGION         the repository's location (default: the region of --zone)
  --repository REPO       the Docker repository (default bertjax): images are
                          REGION-docker.pkg.dev/PROJECT/REPO/NAME:TAG
  --node-service-account EMAIL
                          the TPU node pools' service account (default: read from the
                          cluster; with --dry-run the commands show NODE_SERVICE_ACCOUNT)
  --project-number N      the project's number, for the Compute Engine default account
                          (default: read from gcloud)
  --impersonator MEMBER   who may act as the account for xpk.sh --check, e.g.
                          user:you@example.com (default: the active gcloud account, and
                          nobody for the Compute Engine default account; none: nobody)
  --project ID            BERTJAX_PROJECT           Google Cloud project
  --zone ZONE             BERTJAX_ZONE              the cluster's zone, e.g. us-west4-a
  --dry-run                                         print the commands, run nothing
  --help                                            this text
HELP
}

VALUE_FLAGS+=(--bucket --cluster --cluster-location --region --repository --node-service-account
              --project-number --impersonator)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
BUCKET="" CLUSTER_LOCATION="" REGION="" REPOSITORY=bertjax NODE_SERVICE_ACCOUNT=""
PROJECT_NUMBER="" IMPERSONATOR=""
while (( $# )); do
  case "$1" in
    --help) usage; exit 0 ;;
    --bucket=*) BUCKET="${1#*=}" ;;
    --cluster=*) CLUSTER="${1#*=}" ;;
    --cluster-location=*) CLUSTER_LOCATION="${1#*=}" ;;
    --region=*) REGION="${1#*=}" ;;
    --repository=*) REPOSITORY="${1#*=}" ;;
    --node-service-account=*) NODE_SERVICE_ACCOUNT="${1#*=}" ;;
    --project-number=*) PROJECT_NUMBER="${1#*=}" ;;
    --impersonator=*) IMPERSONATOR="${1#*=}" ;;
    *) parse_common_flag "$1" || die "unknown flag $1 (see --help)" ;;
  esac
  shift
done
require_cluster
require "$BUCKET" "--bucket"
[[ "$BUCKET" == gs://?* ]] || die "--bucket takes gs://BUCKET, got $BUCKET"
BUCKET="gs://$(cut -d/ -f3 <<< "$BUCKET")"
[[ -z "$NODE_SERVICE_ACCOUNT" || "$NODE_SERVICE_ACCOUNT" == ?*@?* ]] \
  || die "--node-service-account takes the account's e-mail, got $NODE_SERVICE_ACCOUNT"
[[ -z "$PROJECT_NUMBER" ]] || require_number "$PROJECT_NUMBER" --project-number
[[ -z "$IMPERSONATOR" || "$IMPERSONATOR" == none || "$IMPERSONATOR" == *:*@* ]] \
  || die "--impersonator takes user:EMAIL, serviceAccount:EMAIL, group:EMAIL or none"
REGION="${REGION:-${ZONE%-*}}"
CLUSTER_LOCATION="${CLUSTER_LOCATION:-${ZONE%-*}}"
SCOPE=(--project="$PROJECT")

# exists COMMAND...: whether a describe finds its resource (1 on NOT_FOUND); any
# other failure ends the script, saying what failed. Under --dry-run, nothing
# is read and nothing exists.
exists() {
  local errors
  (( ! DRY_RUN )) || return 1
  errors="$(mktemp)"
  if "$@" > /dev/null 2> "$errors"; then
    rm -f "$errors"
    return 0
  elif grep -q NOT_FOUND "$errors"; then
    rm -f "$errors"
    return 1
  fi
  fail "$1 $2 $3 $4 failed: $(first_error "$errors")"
}

# value VARIABLE PLACEHOLDER COMMAND...: what a command prints, into VARIABLE;
# PLACEHOLDER under --dry-run.
value() {
  local name="$1" placeholder="$2" result
  shift 2
  if (( DRY_RUN )); then
    result="$placeholder"
  else
    result="$("$@")" || fail "$* failed"
  fi
  printf -v "$name" '%s' "$result"
}

# Runs a grant; the policy gcloud prints goes.
grant() {
  if (( DRY_RUN )); then
    run "$@"
  else
    "$@" > /dev/null || fail "$1 $2 $3 $4 failed (above)"
  fi
}

run gcloud services enable artifactregistry.googleapis.com container.googleapis.com \
  iam.googleapis.com iamcredentials.googleapis.com storage.googleapis.com tpu.googleapis.com \
  "${SCOPE[@]}"

if ! exists gcloud artifacts repositories describe "$REPOSITORY" --location="$REGION" \
    "${SCOPE[@]}"; then
  run gcloud artifacts repositories create "$REPOSITORY" --repository-format=docker \
    --location="$REGION" --description="bertjax images" "${SCOPE[@]}"
fi

# The accounts the pods act as: their TPU node pools'.
if [[ -n "$NODE_SERVICE_ACCOUNT" ]]; then
  NODE_ACCOUNTS=("$NODE_SERVICE_ACCOUNT")
else
  tpu_node_pools "$CLUSTER_LOCATION"
  tpu_node_accounts
fi

# Who may act as them for xpk.sh --check. Acting as the Compute Engine default
# account, which usually holds roles/editor on the project, is an Editor's
# token: granted only to an --impersonator given.
IMPERSONATE_DEFAULT=0
[[ -z "$IMPERSONATOR" ]] || IMPERSONATE_DEFAULT=1
OTHERS=0
for EMAIL in "${NODE_ACCOUNTS[@]}"; do
  compute_default_account "$EMAIL" || OTHERS=1
done
if [[ -z "$IMPERSONATOR" ]] && (( ! OTHERS )); then
  IMPERSONATOR=none
elif [[ -z "$IMPERSONATOR" ]]; then
  value IMPERSONATOR ACCOUNT gcloud config get-value account
  [[ -n "$IMPERSONATOR" ]] || fail "no active gcloud account (gcloud auth login); or give" \
    "--impersonator=MEMBER, or --impersonator=none"
  if [[ "$IMPERSONATOR" == *.gserviceaccount.com ]]; then
    IMPERSONATOR="serviceAccount:$IMPERSONATOR"
  else
    IMPERSONATOR="user:$IMPERSONATOR"
  fi
fi

REPOSITORY_SCOPE=(--location="$REGION" "${SCOPE[@]}")
for EMAIL in "${NODE_ACCOUNTS[@]}"; do
  grant gcloud storage buckets add-iam-policy-binding "$BUCKET" \
    --member="serviceAccount:$EMAIL" --role=roles/storage.objectAdmin
  grant gcloud artifacts repositories add-iam-policy-binding "$REPOSITORY" \
    "${REPOSITORY_SCOPE[@]}" --member="serviceAccount:$EMAIL" --role=roles/artifactregistry.reader
  if compute_default_account "$EMAIL" && (( ! IMPERSONATE_DEFAULT )); then
    echo "gke_setup.sh: not letting you act as $EMAIL, the Compute Engine default service" \
      "account (it usually holds roles/editor on the project), so xpk.sh --check checks it" \
      "without acting as it; better, give the TPU nodes an account of their own (xpk cluster" \
      "create --custom-nodepool-arguments=--service-account=EMAIL, docs/tpu.md), or grant it" \
      "anyway with --impersonator=user:YOU" >&2
  elif [[ "$IMPERSONATOR" != none ]]; then
    grant gcloud iam service-accounts add-iam-policy-binding "$EMAIL" "${SCOPE[@]}" \
      --role=roles/iam.serviceAccountTokenCreator --member="$IMPERSONATOR"
  fi
done

run gcloud auth configure-docker "$REGION-docker.pkg.dev" --quiet
(( DRY_RUN )) || echo "gke_setup.sh: the TPU pods of $CLUSTER act as their node pools'" \
  "service account, ${NODE_ACCOUNTS[*]}, which writes in $BUCKET and reads" \
  "$REGION-docker.pkg.dev/$PROJECT/$REPOSITORY; check a run with launch/xpk.sh ... --check"
