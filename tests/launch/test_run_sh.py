"""launch/run.sh --restarts against the stand-in gcloud of test_scripts.py:
a TPU that create.sh left still being made (CREATING, its queued request
waiting or provisioning) is waited for within one attempt, then set up."""

from tests.launch.test_scripts import _FIRST_RUN_FAILS, _queued_states, _run_with_stub

# The TPU is made in the cloud after `create` fails (gcloud gave up waiting):
# `tpu-vm describe` says PREEMPTED before the create, CREATING for the first
# describes counted after it (of `tpu-vm` directly, of `queued-resources` for a
# queued one), then READY; setting it up (ssh) is refused until then.
_MADE_LATE = r"""made() {
  local n
  n=$(sed -n "/%(group)s create/,\$p" "$TMPDIR/calls.txt" | grep -c "%(group)s describe")
  (( n > %(describes)d ))
}
case "$*" in
  *"tpu-vm create"*) echo "ERROR: (gcloud.compute.tpus.tpu-vm.create) Operation timed out" >&2
    exit 1 ;;
  *"tpu-vm describe"*)
    if ! grep -q "%(group)s create" "$TMPDIR/calls.txt"; then echo PREEMPTED
    elif made; then echo READY; else echo CREATING; fi ;;
%(queued)s
  *"tar -xzf"*) made || { echo "ERROR: (gcloud.compute.tpus.tpu-vm.ssh) [/usr/bin/ssh] exited" \
    "with return code [255]." >&2; exit 255; } ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac"""


def test_a_tpu_still_creating_after_create_failed_is_waited_for_not_set_up(tmp_path):
  """create.sh fails while the TPU goes on being made: the next attempt polls
  its state while it is CREATING (one restart in all) and sets it up once READY."""
  body = _MADE_LATE % {"group": "tpu-vm", "describes": 4, "queued": ""}
  result, calls = _run_with_stub(tmp_path, body, _FIRST_RUN_FAILS,
                                 "--create-flags=--accelerator-type=v4-8", restarts=2)
  assert result.returncode == 0, result.stderr
  created = calls.index("tpu-vm create")
  assert calls[created + 1:] == (["tpu-vm describe"] * 5 + [
      "tpu-vm ssh state", "tpu-vm scp", "tpu-vm ssh setup", "tpu-vm ssh start",
      "tpu-vm ssh follow"])
  assert calls.count("tpu-vm create") == 1 and calls.count("tpu-vm ssh setup") == 1
  assert ("run.sh: bert is CREATING: waiting for it, then setting it up (deleting nothing)"
          in result.stderr)
  assert result.stderr.count("run.sh: bert is CREATING: waiting for it before setting it "
                             "up") == 1
  logs = tmp_path / "bertjax-logs"
  assert (logs / "demo-2.status").read_text() == "0\n"  # the second restart ran it


def test_a_queued_request_still_provisioning_is_waited_for_not_set_up(tmp_path):
  """create.sh fails (gcloud's create errs after the request was made) while
  the queued request is PROVISIONING and its TPU CREATING: the next attempt
  polls the request until it is ACTIVE, then sets the TPU up; nothing is
  deleted or requested again."""
  queued = ('  *"queued-resources create"*) echo "ERROR: (gcloud.compute.tpus.queued-resources.'
            'create) Deadline exceeded" >&2; exit 1 ;;\n'
            + _queued_states("PROVISIONING", "PROVISIONING", "PROVISIONING", "ACTIVE"))
  body = _MADE_LATE % {"group": "queued-resources", "describes": 3, "queued": queued}
  result, calls = _run_with_stub(tmp_path, body, _FIRST_RUN_FAILS,
                                 "--create-flags=--queued --accelerator-type=v4-8", restarts=2)
  assert result.returncode == 0, result.stderr
  created = calls.index("queued-resources create")
  assert calls.count("queued-resources create") == 1
  assert "queued-resources delete" not in calls[created:]
  assert calls.count("tpu-vm ssh setup") == 1
  assert result.stderr.count("run.sh: queued resource bert is PROVISIONING: waiting for it "
                             "before setting it up") == 1
  assert (tmp_path / "bertjax-logs" / "demo-2.status").read_text() == "0\n"


def test_waiting_for_a_tpu_still_creating_is_bounded_by_the_wait_timeout(tmp_path):
  """A TPU that stays CREATING is waited for up to create.sh's --wait-timeout
  (0 here: one look), then the attempt fails as one restart, never set up."""
  body = _MADE_LATE % {"group": "tpu-vm", "describes": 1000, "queued": ""}
  result, calls = _run_with_stub(tmp_path, body, _FIRST_RUN_FAILS,
                                 "--create-flags=--wait-timeout=0 --accelerator-type=v4-8",
                                 restarts=2)
  assert result.returncode == 1, result.stderr
  assert "tpu-vm ssh setup" not in calls and "tpu-vm scp" not in calls
  assert result.stderr.count("run.sh: still waiting after 0s (--wait-timeout): bert is "
                             "CREATING; not setting it up yet") == 1
  assert "run.sh: giving up after 2 restarts (1)" in result.stderr
