#!/usr/bin/env bash
# Copies this checkout to every worker and installs bertjax with the [tpu]
# extra into a virtual environment with its own Python.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/setup.sh [flags]

Packs the committed files of the checkout (git archive HEAD) and copies them to
~/bertjax on every worker. There it installs uv (if the worker has none), lets
uv create ~/bertjax-venv with a Python it downloads (the TPU images ship
Python 3.10; jax, flax, orbax and grain need 3.11 or later), and installs
bertjax into it: uv pip install -e '~/bertjax[tpu]'. run.sh runs that Python.

  --source DIR            the checkout to copy (default: this repository)
  --python VERSION        the Python version for ~/bertjax-venv (default 3.11)
$COMMON_HELP
HELP
}

VALUE_FLAGS+=(--source --python)
normalize_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
SOURCE="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=3.11
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --source=*) SOURCE="${arg#*=}" ;;
    --python=*) PYTHON="${arg#*=}" ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common
[[ "$PYTHON" =~ ^3\.[0-9]+$ ]] || die "--python takes a version such as 3.11, got $PYTHON"

# On the worker: unpack; uv from pip (the image's Python 3.10 runs it fine) or,
# without pip, from uv's installer; a fresh environment with uv's own Python
# (only-managed: not whatever python3.X the image may have); bertjax into it.
INSTALL="rm -rf ~/bertjax && mkdir ~/bertjax && tar -xzf ~/bertjax.tar.gz -C ~/bertjax \
&& export PATH=\"\$HOME/.local/bin:\$PATH\" \
&& { command -v uv > /dev/null || python3 -m pip install -q --user uv \
|| curl -LsSf https://astral.sh/uv/install.sh | sh; } \
&& rm -rf ~/bertjax-venv \
&& uv venv -q --python-preference=only-managed --python=$PYTHON ~/bertjax-venv \
&& uv pip install -q --python=\$HOME/bertjax-venv/bin/python -e \"\$HOME/bertjax[tpu]\" \
&& echo \"\$(hostname): \$(~/bertjax-venv/bin/python --version) in ~/bertjax-venv\""

# Setting up replaces ~/bertjax and ~/bertjax-venv: never under a run that
# still goes (its Python and code would change under it). Asked with the
# workers' own worker.sh, which says "HOST: running" for a live run (and
# fails, as on a fresh worker, when there is none).
LIVE="if bash ~/bertjax/launch/worker.sh state latest 2> /dev/null | grep -q ': running\$'; then \
echo \"\$(hostname): run \$(cat ~/bertjax-logs/latest) is still going\"; fi"
if (( DRY_RUN )); then
  tpu tpu-vm ssh "$NAME" --worker=all --command="$LIVE"
else
  live="$(tpu tpu-vm ssh "$NAME" --worker=all --command="$LIVE")" \
    || fail "could not ask the workers of $NAME whether a run is going"
  [[ -z "$live" ]] || die "$(head -n 1 <<< "$live"): setup would replace its code and Python;" \
    "stop it first (launch/stop.sh) or wait for it to end (launch/logs.sh --follow)"
fi

ARCHIVE="${TMPDIR:-/tmp}/bertjax-$NAME.tar.gz"
run git -C "$SOURCE" archive --format=tar.gz --output="$ARCHIVE" HEAD
tpu tpu-vm scp "$ARCHIVE" "$NAME:bertjax.tar.gz" --worker=all
tpu tpu-vm ssh "$NAME" --worker=all --command="$INSTALL"
