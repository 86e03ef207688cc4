"""`bertjax.config_ranges`: every number of every shipped config (with each of
its arguments) has a range that holds its value, a value just outside is
refused in one line naming the field, and a command refuses it before
anything starts or is written."""

import ast
import fnmatch
import math
import os
import subprocess
import sys

import ml_collections
import pytest

from bertjax import config_ranges, errors, usage
from bertjax.configs import common, squad
from bertjax.data.glue import TASKS
from bertjax.models.config import PRESETS
from bertjax.tasks.features import VARIANTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAIN_OPTIONS = ("no_nsp", "no_nsp_packed", "ltr", "static", "packed", "lamb")


def _shipped_specs() -> list[str]:
  """Every shipped config as `file[:argument]`, with each argument it takes."""
  specs = ["demo_finetune", "swag", "ner", "modernbert_demo", "modernbert_pretrain:base",
           "modernbert_pretrain:large", *(f"glue:{task}" for task in TASKS),
           *(f"squad:{version}" for version in squad.VERSIONS),
           *(f"ner_features:{variant}" for variant in VARIANTS)]
  for file in ("demo", "base_pretrain", "large_pretrain"):
    specs += [file, *(f"{file}:{option}" for option in PRETRAIN_OPTIONS),
              *(f"{file}:size={size}" for size in PRESETS)]
  return specs


SPECS = _shipped_specs()


def _load(spec: str) -> ml_collections.ConfigDict:
  file, _, argument = spec.partition(":")
  return usage.load_config_file(os.path.join(ROOT, "configs", f"{file}.py"), argument)


def _numbers(config: ml_collections.ConfigDict, prefix: str = ""):
  """(field, value, type) of each number of `config`, and of each field
  declared a number but unset (None: SQuAD's null_score_diff_threshold)."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _numbers(value, f"{prefix}{key}.")
      continue
    kind = config.get_type(key) if value is None else type(value)
    if kind in (int, float):
      yield f"{prefix}{key}", value, kind


def test_the_specs_name_every_shipped_config_and_argument():
  files = {name[:-3] for name in os.listdir(os.path.join(ROOT, "configs"))
           if name.endswith(".py") and name not in ("__init__.py", "common.py")}
  assert files == {spec.split(":")[0] for spec in SPECS}
  with pytest.raises(errors.UsageError, match="known: ") as refused:
    common.apply_options(_load("demo"), {"nope": "true"})
  known = ast.literal_eval(str(refused.value).split("known: ", 1)[1])
  assert set(known) == {*PRETRAIN_OPTIONS, "size"}


@pytest.mark.parametrize("spec", SPECS)
def test_every_number_has_a_range_that_holds_its_shipped_value(spec):
  config = _load(spec)
  missing, outside = [], []
  for field, value, _ in _numbers(config):
    allowed = config_ranges.range_of(field, config.task)
    if allowed is None:
      missing.append(field)
    elif value is not None and value not in allowed:
      outside.append(f"{field}={value!r} (must be {allowed})")
  assert not missing, f"configs/{spec}: no range in bertjax/config_ranges.py for {missing}"
  assert not outside, f"configs/{spec}: shipped values outside their ranges: {outside}"
  assert config_ranges.out_of_range(config) is None


def _representatives() -> dict[tuple[str, str], tuple[str, type]]:
  """(field, "pretrain" or "finetune") -> (a shipped config that has it, its type)."""
  found = {}
  for spec in SPECS:
    config = _load(spec)
    kind = "pretrain" if config.task == "pretrain" else "finetune"
    for field, _, number_type in _numbers(config):
      found.setdefault((field, kind), (spec, number_type))
  return found


REPRESENTATIVES = _representatives()


def _step_out(value: float, number_type: type, direction: float) -> float:
  """The next number beyond `value` in `direction` (-inf or inf)."""
  if number_type is int:
    return value + (1 if direction > 0 else -1)
  return math.nextafter(value, direction)


def _just_outside(allowed: config_ranges.Range, number_type: type) -> list[float]:
  """The numbers just past each end of `allowed` (past the special values
  next to an end too), and for a float NaN and infinity."""
  values = []
  for end, is_open, direction in ((allowed.low, allowed.low_open, -math.inf),
                                  (allowed.high, allowed.high_open, math.inf)):
    if not math.isfinite(end):
      continue
    value = end if is_open else _step_out(end, number_type, direction)
    for _ in range(3):  # past -1 ("the devices left") below 0, and the like
      if value not in allowed:
        values.append(number_type(value))
        break
      value = number_type(value + (1 if direction > 0 else -1))
  if number_type is float:
    values += [math.nan, math.inf]
  return values


def _with(config: ml_collections.ConfigDict, field: str, value) -> ml_collections.ConfigDict:
  changed = config.copy_and_resolve_references()
  *parents, leaf = field.split(".")
  node = changed
  for parent in parents:
    node = node[parent]
  node[leaf] = value
  return changed


@pytest.mark.parametrize("field,kind", sorted(REPRESENTATIVES))
def test_a_value_just_outside_is_refused_in_one_line_naming_the_field(field, kind):
  spec, number_type = REPRESENTATIVES[field, kind]
  config = _load(spec)
  allowed = config_ranges.range_of(field, config.task)
  outside = _just_outside(allowed, number_type)
  assert outside, f"{field}: its range {allowed} refuses nothing"
  for value in outside:
    line = config_ranges.out_of_range(_with(config, field, value))
    assert line is not None, f"configs/{spec}: {field}={value!r} is accepted"
    assert line.startswith(f"--config.{field}={value!r}: must be {allowed}"), line
    assert "\n" not in line
    with pytest.raises(errors.UsageError, match=f"^config.{field}="):  # a config built in Python
      config_ranges.check(_with(config, field, value))


@pytest.mark.parametrize("field,kind", sorted(REPRESENTATIVES))
def test_the_ends_and_the_values_that_mean_something_are_accepted(field, kind):
  spec, number_type = REPRESENTATIVES[field, kind]
  config = _load(spec)
  allowed = config_ranges.range_of(field, config.task)
  inside = [end for end, is_open in ((allowed.low, allowed.low_open),
                                     (allowed.high, allowed.high_open))
            if math.isfinite(end) and not is_open]
  inside += [-1.0 if special == config_ranges.NEGATIVE else special
             for special, _ in allowed.also]
  for value in inside:
    value = number_type(value)
    assert config_ranges.out_of_range(_with(config, field, value)) is None, (field, value)


def test_every_row_of_the_table_serves_a_shipped_field():
  fields = {"model." + field[len("train.long_model."):]
            if field.startswith("train.long_model.") else field for field, _ in REPRESENTATIVES}
  unused = [pattern for pattern in config_ranges.RANGES
            if not any(fnmatch.fnmatchcase(field, pattern) for field in fields)]
  assert not unused, f"rows of config_ranges.RANGES that no shipped config has: {unused}"


def test_the_long_phases_model_fields_have_the_models_ranges():
  assert (config_ranges.range_of("train.long_model.global_rope_theta", "pretrain")
          == config_ranges.range_of("model.global_rope_theta", "pretrain"))
  assert (config_ranges.range_of("train.long_model.hidden_dropout_prob", "pretrain")
          == config_ranges.range_of("model.hidden_dropout_prob", "pretrain"))


def test_fine_tuning_takes_a_negative_dropout_and_pre_training_does_not():
  finetune, pretrain = _load("glue:mrpc"), _load("demo")
  assert config_ranges.out_of_range(_with(finetune, "model.hidden_dropout_prob", -1.0)) is None
  assert config_ranges.out_of_range(_with(pretrain, "model.hidden_dropout_prob", -1.0)) == (
      "--config.model.hidden_dropout_prob=-1.0: must be in [0, 1); docs/configs.md lists each "
      "field's range")


def test_a_config_built_in_python_is_refused_before_its_workdir_is_touched(tmp_path):
  from bertjax import tasks

  config = _with(_load("glue:mrpc"), "train.learning_rate", -2e-5)
  with pytest.raises(errors.UsageError, match=r"^config\.train\.learning_rate=-2e-05: must be > 0"):
    tasks.run(config, str(tmp_path / "run"))
  assert not os.listdir(tmp_path)


def test_a_negative_learning_rate_is_refused_before_anything_starts(tmp_path):
  """The command fails fast: no JAX imported (so nothing compiled), no
  workdir made, one line on stderr, exit status 2."""
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "-X", "importtime", "-m", "bertjax.main", "--config=configs/demo.py",
       "--config.optimizer.learning_rate=-1e-4", f"--workdir={workdir}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:")]
  said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
  assert result.returncode == 2, result.stderr[-3000:]
  assert said == ["error: --config.optimizer.learning_rate=-0.0001: must be > 0; "
                  "docs/configs.md lists each field's range"]
  assert "bertjax.config_ranges" in imported and "jax" not in imported
  assert not workdir.exists() and not os.listdir(tmp_path)
