#!/usr/bin/env bash
# Copies this checkout to every worker and installs bertjax with the [tpu] extra.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<HELP
Usage: launch/setup.sh [flags]

Packs the committed files of the checkout (git archive HEAD), copies them to
~/bertjax on every worker and runs pip install -e '.[tpu]' there.

  --source=DIR            the checkout to copy (default: this repository)
$COMMON_HELP
HELP
}

SOURCE="$(cd "$(dirname "$0")/.." && pwd)"
for arg in "$@"; do
  case "$arg" in
    --help) usage; exit 0 ;;
    --source=*) SOURCE="${arg#*=}" ;;
    *) parse_common_flag "$arg" || die "unknown flag $arg (see --help)" ;;
  esac
done
require_common

ARCHIVE="${TMPDIR:-/tmp}/bertjax-$NAME.tar.gz"
run git -C "$SOURCE" archive --format=tar.gz --output="$ARCHIVE" HEAD
tpu tpu-vm scp "$ARCHIVE" "$NAME:bertjax.tar.gz" --worker=all
tpu tpu-vm ssh "$NAME" --worker=all --command="rm -rf ~/bertjax && mkdir ~/bertjax \
&& tar -xzf ~/bertjax.tar.gz -C ~/bertjax && python3 -m pip install -q -e \"\$HOME/bertjax[tpu]\""
