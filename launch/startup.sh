#!/usr/bin/env bash
# The TPU's startup script: create.sh puts it in the TPU's metadata
# (startup-script), and every worker runs it as root at every boot. After a
# restart of the host (a maintenance event), the run that the restart cut off
# starts again, as the user who started it: worker.sh boot, from that user's
# checkout (setup.sh), decides. A run that ended, or that stop.sh stopped, stays
# as it is; a fresh slice (no checkout yet) has nothing to do. Under systemd,
# each user's run gets a scope of its own (systemd-run --scope): the end of the
# service that runs startup scripts does not take it along.
#
# BERTJAX_HOMES (default /home) is where the users' homes are.
set -uo pipefail

if [[ "${1:-}" == --help ]]; then
  cat <<HELP
Usage: launch/startup.sh

The TPU's startup script (create.sh sets it; each worker runs it as root at
boot): resumes, as its user, the run that a restart of this host cut off
(launch/worker.sh boot in each home under BERTJAX_HOMES, default /home). Nothing
to run from your own machine.
HELP
  exit 0
fi

shopt -s nullglob
scope=()
if command -v systemd-run > /dev/null && [[ -d /run/systemd/system ]]; then
  scope=(systemd-run --scope --quiet --collect)
fi
for worker in "${BERTJAX_HOMES:-/home}"/*/bertjax/launch/worker.sh; do
  home="${worker%/bertjax/launch/worker.sh}"
  user="$(stat -c %U "$home")"
  if [[ "$user" == "$(id -un)" ]]; then
    HOME="$home" ${scope[@]+"${scope[@]}"} bash "$worker" boot
  else
    ${scope[@]+"${scope[@]}"} runuser -u "$user" -- env HOME="$home" bash "$worker" boot
  fi || echo "startup.sh: worker.sh boot failed for $user ($?)" >&2
done
exit 0
