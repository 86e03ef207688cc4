"""Pre-training: the loop that runs `train_step` over the data, with checkpoints.

The run is one or two phases: `train.max_seq_length` (128 in the paper) until
`train.long_from_step`, then `train.long_seq_length` (512) to the end, as one
run with one optimizer schedule. Everything a restart needs is checkpointed:
the state, each host's loader position and the phase, so rerunning the same
command continues exactly where the last checkpoint left off.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import ml_collections

from bertjax import (checkpoint, divergence, errors, files, flops, hosts, metrics, optim,
                     outage, pace, preemption, runs, sharding, signals, throughput, time_left,
                     train)
from bertjax.data import loader
from bertjax.models import EncoderConfig
from bertjax.phases import Phase, phases
from bertjax.tasks import pretrain_resume
from bertjax.tasks.pretrain_checks import stage_accumulation, validate
from bertjax.tasks.pretrain_data import (check_stream, check_vocabulary, data_identity,
                                         loader_config, prepare_data, sequences_per_row,
                                         stream_settings)
from bertjax.tasks.pretrain_stop import (HANGUP_EXIT_CODE, INTERRUPTED_EXIT_CODE,
                                         PREEMPTED_EXIT_CODE, exit_unsaved, save_on_stop)

def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Pre-trains as `config` says, resuming from `workdir` if it holds a checkpoint.

  Returns:
    The last logged training metrics and the last evaluation.

  Raises:
    SystemExit(PREEMPTED_EXIT_CODE) after saving when preempted, and
    SystemExit(INTERRUPTED_EXIT_CODE) after saving on a first Ctrl-C.
  """
  return _Trainer(config, workdir).run()


class _Trainer:
  """One run: the mesh, model, state, data, checkpoints and metrics."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config, self.workdir = config, workdir
    devices = jax.devices()
    self.mesh = sharding.make_mesh(validate(config, len(devices)))
    self.rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
    self.data_dir = prepare_data(config, workdir)
    check_vocabulary(config, self.data_dir)
    self.bert = EncoderConfig.from_run_config(config)
    self.model = train.pretraining_model(self.bert, config.objective)
    self.phases = phases(config)
    self.total_steps = config.train.total_steps
    self.time_left = time_left.TimeLeft(config, self.phases, self.bert)
    self.pace = pace.Pace(config, devices[0].platform, len(devices))  # expected speed
    self.optimizer, self.learning_rate_fn = optim.make_optimizer(config)
    self.writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0, config=config)
    self.checkpointer = checkpoint.Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep,
        async_save=config.checkpoint.async_save)
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    # The batch-size warmup's loader batches, joined into a step's batch (on
    # the mesh, rows in their order).
    self._concatenate = jax.jit(
        lambda parts: jax.tree.map(lambda *x: jax.numpy.concatenate(x), *parts),
        out_shardings=self.batch_sharding)
    self.peak, peak_source = flops.peak_tflops(self.bert.dtype)
    # A CPU's peak is measured again now and then (its best rate is the peak).
    self.peak_measured_at = time.monotonic() if devices[0].platform == "cpu" else None
    self.meter = throughput.Meter()
    self.warned_input_bound = False
    self.workers = 0  # loader processes of the phase running
    self.stop: signals.StopRequests | None = None
    self.saving: int | None = None  # the step of the last save started
    self.guard: divergence.DivergenceGuard | None = None  # the loss's range, once restored
    self.save_deferred = False  # a save that waits for the loss to come back in range
    self.save_again = False  # a save the storage failed, made again once it answers
    self.stopping = False  # a stop was requested: saving now, if at all
    self.clock = preemption.SaveClock(config.checkpoint.every_seconds)
    self.last_eval: dict[str, float] = {}
    self.last_eval_step = 0
    self.last_step = 0  # the last step whose metrics came back
    # A line 10 steps into each session too: its speed and ETA within a
    # minute on a CPU, not after the first `log_every_steps`.
    self.early_log_step = 10
    logging.info("Mesh %s over %d devices (%s); peak %s TFLOP/s per device (%s)",
                 dict(self.mesh.shape), len(devices), devices[0].device_kind,
                 "unknown" if self.peak is None else f"{self.peak:.3f}", peak_source)

  def run(self) -> dict[str, float]:
    """Trains to the end (or a preemption); the metrics are stored on any exit."""
    error = None
    try:
      return self._train()
    except BaseException as e:  # the trackers record how the run ended
      error = e
      raise
    finally:
      self.writer.close(error)

  def _train(self) -> dict[str, float]:
    config = self.config
    result: dict[str, float] = {}
    with (jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules),
          signals.StopRequests(multi_process=jax.process_count() > 1) as self.stop):
      abstract = train.abstract_train_state(self.model, self.optimizer, config.seed)
      shardings = train.state_shardings(abstract, self.mesh, self.rules)
      logging.info("Training %s", self.bert.describe(sum(
          leaf.size for leaf in jax.tree.leaves(abstract.params))))
      state, restored_data = self._restore_or_init(abstract, shardings)
      self.early_log_step = int(state.step) + 10
      self._check_resumed_stream(state, restored_data)
      # The range of losses goes on from the checkpoint's when they are of the
      # same phase and data (those saved before they said so: of its phase).
      data = data_identity(config, self.data_dir)
      self.guard = divergence.DivergenceGuard.from_config(
          config.divergence, restored_data,
          of=None if restored_data is None else {"phase": restored_data["phase"], "data": data})
      changes = runs.schedule_changes(config, self.workdir) if restored_data else []
      if changes:
        logging.warning("This rerun changes the run's schedule from step %d on (the steps "
                        "trained keep theirs): %s", int(state.step), "; ".join(changes))
      # Checked and restored: now the workdir's config.json may say what it holds.
      runs.save_config(config, self.workdir)
      self.shardings = shardings
      try:
        for phase in self.phases:
          if int(state.step) >= phase.end:
            continue
          # Another phase's losses (its length, its data) are not this one's range.
          self.guard.begin({"phase": phase.index, "data": data}, self._advice,
                           f"phase {phase.index - 1} ended there, with no checkpoint saved since")
          state, result = self._train_phase(phase, state, restored_data, result)
        step = int(state.step)
        if self.checkpointer.latest_step() != step:  # the last step is always kept
          # Saved by the rule of every save; with no step after it to wait for,
          # losses out of range are judged now: re-based on, or the run stops.
          self.guard.conclude(self._advice, "the run ended there: its last step is not saved")
          while not self._save(step, state, {"phase": self.phases[-1].index, "loader": None,
                                             **self.guard.state()}):
            pass  # the storage answers again (else the wait has raised): save it now
      except KeyboardInterrupt:  # a second Ctrl-C (or any before the first step): no waiting
        if not self.stop.training:
          raise  # nothing of this run's to save or to abandon
        in_flight = self.checkpointer.saving()
        # What a rerun finds is what is committed on the storage once no save can
        # commit any more (one already committing is waited for).
        committed, caveat = self.checkpointer.abandon()
        resume = (f"{committed[-1]}" if committed else "0 (no finished checkpoint)")
        logging.error("Aborted: %s; a rerun resumes from step %s%s",
                      f"the save of step {self.saving} is abandoned"
                      if in_flight and self.saving not in committed
                      else "no checkpoint save was left unfinished", resume,
                      f" ({caveat})" if caveat else "")
        raise
      except preemption.ExitAtOnce:
        raise  # SIGTERM with no time to save: a save in flight is abandoned
      except BaseException as e:  # an error, or the stop after a preemption's save
        if not isinstance(e, SystemExit) and self.checkpointer.saving():
          logging.error("Stopping on %s; finishing the checkpoint of step %d first",
                        type(e).__name__, self.saving)
        self.checkpointer.close()  # waits for the save in flight
        if isinstance(e, errors.TrainingStoppedError):
          self._set_aside_diverged()
        raise
      self.checkpointer.close()
    runs.say_pretraining_is_done(self.workdir, int(state.step), self.last_eval,
                                 self.last_eval_step,
                                 demo=self.config.data.build_from.startswith("demo:"))
    return result

  def _advice(self) -> str:
    """Where a rerun resumes, and what to change first (a run that diverged)."""
    steps = self.checkpointer.all_steps()  # and a save in flight, finished before the exit
    steps += [self.saving] if self.checkpointer.saving() else []
    diverged = self._diverged_steps(steps)
    good = [step for step in steps if step not in diverged]
    resume = f"step {max(good)}" if good else "step 0 (no checkpoint)"
    aside = (f" (step {', '.join(map(str, diverged))}, saved as the loss left its range, goes "
             "to checkpoints_diverged/)" if diverged else "")
    # The rate of the steps that diverged: the long phase's or a restart's, where set.
    start = self.guard.diverged_from() if self.guard is not None else None
    setting, rate = optim.learning_rate_setting(
        self.config, self.last_step if start is None else start)
    return (f"a rerun resumes from {resume}{aside}: lower {setting} (now {rate:g}) or check "
            "the data first (the bound: --config.divergence.factor)")

  def _diverged_steps(self, steps: list[int]) -> list[int]:
    """The saved steps that hold weights out of range: a save lands one step
    before the loss of its weights is known."""
    start = self.guard.diverged_from() if self.guard is not None else None
    return [] if start is None else sorted(step for step in steps if step >= start)

  def _set_aside_diverged(self) -> None:
    """Moves the steps saved with weights out of range to checkpoints_diverged/
    (every save has finished), so that a rerun resumes before them."""
    diverged = self._diverged_steps(self.checkpointer.all_steps())
    if not diverged:
      return
    aside = files.join(self.workdir, "checkpoints_diverged")
    pretrain_resume.set_aside(self.checkpointer, diverged, aside, "diverged")
    logging.warning("Step %s holds weights whose loss was out of range: moved to %s",
                    ", ".join(map(str, diverged)), aside)

  def _resumable_step(self) -> int | str:
    finished = self.checkpointer.all_steps()  # not the save in flight
    return finished[-1] if finished else "0 (no finished checkpoint)"

  def _restore_or_init(self, abstract, shardings):
    """(state, this host's data position or None): the newest step that reads
    back on every host (`pretrain_resume`), or a fresh state."""
    restored = pretrain_resume.restore_newest(
        self.checkpointer, checkpoint.abstract_with_shardings(abstract, shardings),
        self.workdir)
    if restored is None:
      return train.init_train_state(self.model, self.optimizer, self.config.seed,
                                    shardings), None
    return restored

  def _check_resumed_stream(self, state, restored_data: dict[str, Any] | None) -> None:
    """A data position that the run will resume must be in the stream these
    settings make (a phase that starts afresh reads from its beginning)."""
    if restored_data is None or restored_data["loader"] is None:
      return
    resumed = [phase for phase in self.phases if phase.index == restored_data["phase"]]
    if resumed and int(state.step) < resumed[0].end:
      check_stream(restored_data.get("stream"), stream_settings(self.config))

  def _train_phase(self, phase: Phase, state, restored_data, result):
    """Opens the phase's data where the checkpoint left it and runs its steps."""
    config = self.config
    logging.info("Phase %d: steps %d-%d at length %d, %d %s a step%s", phase.index,
                 phase.start, phase.end, phase.max_seq_length, phase.batch_size,
                 "rows" if config.data.max_sequences_per_row > 1 else "sequences",
                 "".join(f", {name}={value}" for name, value in phase.model_changes))
    if phase.ramp_steps:
      largest = phase.parts(phase.start + phase.ramp_steps - 1) * phase.ramp_start
      logging.info("Batch-size warmup: %d, %d, ... %d a step over steps %d-%d, then %d",
                   phase.ramp_start, 2 * phase.ramp_start, largest, phase.start,
                   phase.start + phase.ramp_steps, phase.batch_size)
    opt = config.optimizer
    for i, restart in enumerate(optim.parse_restarts(opt.get("restarts", ()), opt.warmup_steps,
                                                     config.train.total_steps)):
      if phase.start <= restart.step < phase.end:
        logging.info("Restart at step %d (optimizer.restarts[%d]): learning rate %g, weight "
                     "decay %g, the optimizer's moments kept", restart.step, i,
                     restart.learning_rate, restart.weight_decay)
    # The steps of the phase's model (the same parameters; a phase may change
    # how it computes, e.g. ModernBERT's rotary base), one per batch size of
    # the warmup: each takes the configured micro-batches.
    model = train.pretraining_model(phase.model(self.bert), config.objective)
    micro = phase.batch_size // config.train.accumulation_steps
    jitted: dict[int, tuple[Any, Any]] = {}

    def steps_for(parts: int):
      if parts not in jitted:
        jitted[parts] = train.jit_steps(
            model, self.optimizer, self.learning_rate_fn, config.objective,
            stage_accumulation(parts * phase.loader_batch, micro), self.shardings,
            self.batch_sharding, sharding.replicated(self.mesh))
      return jitted[parts]

    self.steps_for = steps_for
    self.eval_step = steps_for(phase.batch_size // phase.loader_batch)[1]
    resuming = restored_data is not None and restored_data["phase"] == phase.index
    self.workers = self._loader_workers(phase, restored_data if resuming else None)
    iterator = loader.DeviceIterator(iter(loader.make_dataset(
        loader_config(config, self.data_dir, phase, "train", phase.loader_batch,
                      worker_count=self.workers),
        jax.process_index(), jax.process_count())), self.batch_sharding)
    try:
      if resuming:
        if restored_data["loader"] is None:
          logging.warning("The checkpoint ends its run; the data of the steps added after it "
                          "starts from the beginning of phase %d", phase.index)
        else:
          iterator.set_state(restored_data["loader"])
      return self._run_phase(phase, state, iterator, result)
    finally:
      iterator.close()

  def _loader_workers(self, phase: Phase, restored_data: dict[str, Any] | None) -> int:
    """The phase's loader processes: those its checkpoint was saved with (the
    loader's state depends on them), else `data.worker_count`, else (-1) the
    rule of `throughput.loader_workers` for these devices."""
    configured = self.config.data.worker_count
    if restored_data is not None and restored_data["loader"] is not None:
      saved = restored_data.get("workers", max(configured, 0))  # older checkpoints: as set
      if configured >= 0 and configured != saved:
        logging.warning("data.worker_count=%d, but the checkpoint's loader position is of %d "
                        "worker processes: resuming with %d", configured, saved, saved)
      return saved
    if configured >= 0:
      return configured
    device = jax.local_devices()[0]
    workers = throughput.loader_workers(
        platform=device.platform, length=phase.max_seq_length,
        flops_per_row=phase.max_seq_length * flops.flops_per_token(
            phase.model(self.bert), phase.max_seq_length, phase.max_predictions),
        local_devices=jax.local_device_count(), peak_tflops=self.peak,
        cpus=os.cpu_count() or 1,
        sequences_per_row=sequences_per_row(self.config, self.data_dir, phase.max_seq_length))
    logging.info("Input pipeline: %d worker process(es) for length %d (data.worker_count=-1: "
                 "bertjax.throughput.loader_workers)", workers, phase.max_seq_length)
    return workers

  def _meta(self) -> dict[str, Any]:
    return {"model": self.config.model.to_dict(), "objective": self.config.objective}

  def _run_phase(self, phase: Phase, state, iterator, result):
    """The steps of one phase; returns (state, last metrics)."""
    config = self.config
    length = phase.max_seq_length
    step = int(state.step)
    programs: dict[int, Any] = {}  # loader batches a step -> its compiled step

    def fetch(step: int):
      """(compiled step, batch) of the step after `step` steps."""
      parts = phase.parts(step)
      batches = [next(iterator) for _ in range(parts)]
      batch = batches[0] if parts == 1 else self._concatenate(batches)
      held = 0.0
      if parts not in programs:
        started = time.perf_counter()
        programs[parts] = self._compile(self.steps_for(parts)[0], state, batch, step, length)
        held = time.perf_counter() - started
        self.time_left.compiled(phase, parts, held)
        self.meter.hold(held)  # neither the steps' time nor waiting for input
      return programs[parts], batch, parts * phase.loader_batch, held

    compiled, batch, rows, _ = fetch(step)

    profile_dir = os.path.join(self.workdir, "profile")
    pending = None  # (step, device metrics): fetched one step late
    self.meter.restart(step)
    while step < phase.end:
      if config.profile.start_step >= 0 and step == config.profile.start_step:
        jax.profiler.start_trace(profile_dir)
      self.stop.begin_training()
      state, step_metrics = compiled(state, batch)
      step += 1
      if pending is not None:
        result = self._report(*pending, length) or result
      pending = (step, step_metrics, rows)
      if config.profile.start_step >= 0 and step == (config.profile.start_step
                                                     + config.profile.num_steps):
        jax.profiler.stop_trace()

      if self.clock.in_flight() and not self.checkpointer.saving():
        self.clock.done()
      # Evaluated before the step's stop and save: a stop request during the
      # evaluation ends it (unrecorded) and is acted on at this step, and a
      # rerun from this step's checkpoint misses none of its lines.
      # Every run ends with one, whatever its length.
      evaluating = config.eval.every_steps > 0 and (
          step % config.eval.every_steps == 0 or step == config.train.total_steps)
      if evaluating and not self.stop.stop_now():
        if pending is not None:  # timed before evaluating
          result = self._report(*pending, length, last=True) or result
          pending = None
        result.update(self._evaluate(state, phase, step))
        self.meter.restart(step)  # evaluation left out
      stopping = self.stop.stop_now() or self.checkpointer.reached_preemption(step)
      self.stopping = stopping
      if stopping and not save_on_stop(self.stop, self.clock, self.checkpointer, step):
        exit_unsaved(self.checkpointer, self.clock, step, self.saving)
      saved = False
      if (stopping or self.save_deferred or self.save_again
          or step % config.checkpoint.every_steps == 0 or self._due_by_clock()):
        # The step's own metrics first: the metrics stored with a checkpoint
        # reach its step, so that a rerun from it misses no line.
        if pending is not None:
          result = self._report(*pending, length, last=stopping or step == phase.end) or result
          pending = None
        saved = self._save_in_range(step, state, {
            "phase": phase.index, "loader": iterator.get_state(), "workers": self.workers,
            "stream": stream_settings(config), **self.guard.state()})
      if stopping and self.save_again:  # the storage failed the save: no time to wait
        exit_unsaved(self.checkpointer, self.clock, step, self.saving)
      if stopping:
        self.checkpointer.close()
        if not saved:  # its loss is out of range: so are the weights of a save just before
          self._set_aside_diverged()
        interrupted = self.stop.interrupted
        logging.warning("%s: %s; rerun the same command to resume",
                        "Interrupted" if interrupted else "Preempted",
                        f"checkpoint saved at step {step}" if saved else
                        f"no checkpoint saved at step {step}, whose {self.guard.describe()} "
                        f"({self._advice()})")
        raise SystemExit((HANGUP_EXIT_CODE if self.stop.requested == "SIGHUP" else
                          INTERRUPTED_EXIT_CODE) if interrupted else PREEMPTED_EXIT_CODE)
      if step < phase.end:
        waiting = time.perf_counter()
        # Prefetched while the device runs: waiting is input-bound. (A warmup's
        # next batch size compiles here, its time held out of the throughput.)
        compiled, batch, rows, held = fetch(step)
        self.meter.waited(time.perf_counter() - waiting - held)
    if pending is not None:
      result = self._report(*pending, length, last=True) or result
    return state, result

  def _due_by_clock(self) -> bool:
    """Whether `checkpoint.every_seconds` have passed since the last save
    started (process 0's clock decides for every host)."""
    if self.clock.every_s <= 0:
      return False
    return bool(hosts.from_process_0(int(self.clock.due())))

  def _compile(self, step_fn, state, batch, step: int, length: int):
    """The training step compiled for `batch`'s shape; its time and memory logged."""
    start = time.perf_counter()
    compiled = step_fn.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    memory = _memory_numbers(compiled.memory_analysis())
    rows = jax.tree.leaves(batch)[0].shape[0]
    logging.info("Compiled the step for length %d (%d a step) in %.1f s; memory: %s", length,
                 rows, compile_s, ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in memory.items()))
    self.writer.write(step, {"compile_s": compile_s, **memory}, "setup/")
    return compiled

  def _save_in_range(self, step: int, state: train.TrainState,
                     data_state: dict[str, Any]) -> bool:
    """Saves the step unless its loss is out of its recent range (the save then
    waits for the first step back in range); returns whether it saved."""
    if self.guard.out_of_range:
      if not self.save_deferred:
        logging.warning("The checkpoint of step %d waits: %s", step, self.guard.describe())
      self.save_deferred = True
      return False
    if self.save_deferred:
      logging.info("The loss is back in range at step %d: saving the checkpoint there", step)
    self.save_deferred = False
    return self._save(step, state, data_state)

  def _save(self, step: int, state: train.TrainState, data_state: dict[str, Any]) -> bool:
    """Starts a checkpoint save and stores the metrics so far; the time this
    holds the loop is left out of the throughput (and logged). Returns whether
    the save started: storage that does not answer is waited for instead
    (`save_again` then asks for the next step's save)."""
    jax.block_until_ready(state)  # the step's own time stays in its window
    started = time.perf_counter()
    self.saving = step
    failure = None
    try:
      self.checkpointer.save(step, state, data_state, self._meta())
    except checkpoint.CheckpointSaveError as e:
      failure = e
    # Every host learns the worst outcome: 1 storage that does not answer
    # (waited for, then saved again), 2 anything else (every host stops).
    outcome = 0 if failure is None else 1 if errors.storage_unreachable(failure) else 2
    outcome = hosts.worst(outcome)
    if outcome == 2:
      hosts.agree(failure if failure is not None and not errors.storage_unreachable(failure)
                  else None, f"saving the checkpoint of step {step}")
    self.save_again = outcome == 1
    if outcome == 1 and not self.stopping:  # on a stop there is no time to wait
      self._wait_for_storage(failure, step)
    elif outcome == 0:
      self.clock.done()  # the save before this one has finished: `save` waited for it
      self.clock.started(step)
      if not self.checkpointer.saving():
        self.clock.done()  # written already (synchronous saves)
    # Every step up to a checkpoint is in the metrics (on gs:// they go in
    # batches): a run killed after it resumes there and loses no line.
    self.writer.flush()
    held = time.perf_counter() - started
    self.meter.hold(held)
    self.writer.write(step, {"save_blocking_s": held}, "checkpoint/")
    return outcome == 0

  def _wait_for_storage(self, failure: BaseException | None, step: int) -> None:
    """Waits for the checkpoints' storage to answer again (`bertjax.outage`);
    the next step is saved then. Gives up restartably after --storage_wait_s."""
    directory = self.checkpointer.directory
    resumes = f"from step {self._resumable_step()}"
    if failure is None:  # another host's save failed: this one waits with it
      failure = errors.StorageUnreachableError(f"another host could not save step {step}")
    failure = errors.storage_unreachable(failure) or failure  # what did not answer, and how
    outage.wait_until_reachable(directory, lambda: files.exists(directory), failure, resumes)
    logging.warning("The checkpoint of step %d was not saved: saving the next step", step)

  def _report(self, step: int, device_metrics, rows: int, length: int,
              last: bool = False) -> dict[str, Any] | None:
    """Fetches a step's metrics (the device is busy with the next); logs if due.

    `last`: the last step before an evaluation, the phase's end or a preemption,
    always logged, with the throughput averaged since the phase began or the
    last evaluation ended. A window is timed between two fetches, so when the
    host is held up between them (a busy machine) it gains or loses part of a
    step; over consecutive windows that evens out, but not for the window that
    ends an interval (with one-step windows it could read 10x off).
    """
    config = self.config
    values = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    self.last_step = step
    # The loss of the weights before the step: those a checkpoint would hold,
    # whether or not the step's update was skipped.
    self.guard.update(step, values["loss"], self._advice, values["grad_norm"])
    if values["consecutive_skipped"] >= config.max_consecutive_skips:
      raise errors.TrainingStoppedError(
          f"{int(values['consecutive_skipped'])} consecutive steps had a non-finite loss or "
          f"gradients (up to step {step}); {self._advice()}, or raise max_consecutive_skips")
    work = {name: values.pop(name) for name in _WORK}
    self.meter.add(rows, work["real_tokens"], work["sequences"], work["model_flops"])
    if not last and step % config.log_every_steps and step != self.early_log_step:
      return None
    # Steps up to `step` are done (its metrics arrived): time per finished step.
    # Rates of all the window's steps (a batch-size warmup's grow within it).
    rates = self.meter.take(step, whole_interval=last)
    values["sequences_per_s"] = rates.sequences_per_s
    values["tokens_per_s"] = rates.rows_per_s * length  # padding included
    values["real_tokens_per_s"] = rates.real_tokens_per_s
    values["padding"] = 1 - values["real_tokens_per_s"] / values["tokens_per_s"]
    values["tflops_per_s_per_device"] = rates.model_flops_per_s / jax.device_count() / 1e12
    if (self.peak_measured_at is not None
        and time.monotonic() - self.peak_measured_at > _CPU_PEAK_EVERY_SECONDS):
      self.peak, _ = flops.cpu_peak_tflops(self.bert.dtype)
      self.peak_measured_at = time.monotonic()
    if self.peak is not None:
      values["mfu"] = values["tflops_per_s_per_device"] / self.peak
    values["input_wait"] = rates.input_wait_share
    if rates.input_bound and not self.warned_input_bound and jax.process_index() == 0:
      self.warned_input_bound = True
      logging.warning("Input-bound: the steps up to %d waited for data %.0f%% of the time; "
                      "raise data.worker_count (now %d) or check the data's storage", step,
                      100 * rates.input_wait_share, self.workers)
    values["eta_s"] = self.time_left.seconds(step, 1 / max(rates.rows_per_s, 1e-9),
                                             evaluating_now=last)
    price = config.get("price_per_chip_hour", 0.0)
    if price > 0:  # the devices' hours left at this speed, at the user's price
      values["cost_left"] = values["eta_s"] / 3600 * jax.device_count() * price
    values["max_seq_length"] = length
    speed = self.pace.say(step, rows, values, rates.other_cores)  # on the first line, or news
    if jax.process_index() == 0:
      metrics.log(metrics.format_line(step, self.total_steps, values)
                  + (f"  | {speed}" if speed else ""))
    self.writer.write(step, values, "train/")
    return values

  def _evaluate(self, state, phase: Phase, step: int) -> dict[str, float]:
    """MLM loss/perplexity/accuracy and NSP accuracy on the held-out documents."""
    config, started = self.config, time.perf_counter()
    eval_config = dataclasses.replace(
        loader_config(config, self.data_dir, phase, "eval", config.eval.batch_size,
                      seed_offset=1), shuffle_window=1, worker_count=0)
    iterator = loader.DeviceIterator(iter(loader.make_dataset(
        eval_config, jax.process_index(), jax.process_count())), self.batch_sharding)
    totals: dict[str, float] = {}
    try:
      for done in range(config.eval.batches):
        if self.stop.stop_now():  # the grace is for the checkpoint, not this
          logging.warning("%s during the evaluation at step %d: it stopped after %d of %d "
                          "batches and is not recorded", self.stop.requested, step, done,
                          config.eval.batches)
          return {}
        for name, value in jax.device_get(self.eval_step(state.params, next(iterator))).items():
          totals[name] = totals.get(name, 0.0) + float(value)
    finally:
      iterator.close()
    values = train.summarize_eval(totals)
    self.time_left.evaluated(phase, time.perf_counter() - started)
    self.last_eval, self.last_eval_step = values, step
    if jax.process_index() == 0:
      metrics.log(f"eval at step {step}: "
                  + "  ".join(f"{k} {v:.4f}" for k, v in values.items()))
    self.writer.write(step, values, "eval/")
    return {f"eval_{k}": v for k, v in values.items()}


# How often a CPU run measures its matmul rate again (`flops.cpu_peak_tflops`:
# six 2048x2048 matmuls each time).
_CPU_PEAK_EVERY_SECONDS = 600.0
# A step's useful work (`bertjax.train.batch_work`), turned into rates.
_WORK = ("real_tokens", "sequences", "token_pairs", "local_token_pairs", "predictions",
         "nsp_pairs", "model_flops")


def _memory_numbers(memory) -> dict[str, float]:
  if memory is None:
    return {}
  names = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
           "generated_code_size_in_bytes")
  return {name.replace("_in_bytes", ""): float(getattr(memory, name))
          for name in names if hasattr(memory, name)}
