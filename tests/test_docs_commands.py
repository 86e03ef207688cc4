"""Every command in the README, the docs and the configs' and tools' docstrings
is checked against the code, so the documentation cannot drift from it:

- `python -m bertjax.main ...`: the config loads with its argument and every
  `--config.*` override, and names a known task;
- `python -m bertjax.<tool> ...`: the tool accepts every flag (and has the
  required ones, for commands written out in full);
- `launch/*.sh ...`: a dry run succeeds, with the `export`s before it;
- `pip install ...`: each extra exists in setup.py.

The commands that are cheap to run for real (data preparation, the Python
example) are run by tests/test_readme*.py; the rest would need real data and
checkpoints. Inline mentions (`python -m bertjax.tools.sweep`) may leave
out required flags.
"""

import ast
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "launch/README.md", *sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
DOCSTRINGS = sorted(os.path.relpath(p, ROOT) for pattern in (
    "configs/*.py", "bertjax/main.py", "bertjax/tools/*.py")
    for p in glob.glob(os.path.join(ROOT, pattern)))
COMMAND_START = re.compile(r"^(time\s+)?(python -m bertjax|python benchmarks/|launch/\w+\.sh|"
                           r"pip install|pytest|export BERTJAX_|docker (build|push) )")
# A usage synopsis (`--config=<file>[:<argument>]`, `[--out-file F]`), not a command.
SYNOPSIS = re.compile(r"<\w+>|\[-")


def _lines(text: str) -> list[str]:
  """Command lines of a code block or docstring (continuations joined)."""
  return [line.strip() for line in re.sub(r"\\\n\s*", " ", text).splitlines()]


def _commands(source: str, text: str) -> list[tuple[str, str, bool]]:
  """(where, command, partial) for each command in a document or docstring."""
  found = []
  if source.endswith(".py"):
    docstring = ast.get_docstring(ast.parse(text)) or ""
    blocks, inline = [docstring], []
  else:
    blocks = [b for lang, b in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang != "python"]
    inline = re.findall(r"`((?:python -m bertjax|launch/\w+\.sh|pip install)[^`]*)`", text)
  for block in blocks:
    for line in _lines(block):
      if COMMAND_START.match(line) and not SYNOPSIS.search(line):
        for part in line.split("&&"):
          found.append((source, part.strip(), False))
  found += [(source, command, True) for command in inline if not SYNOPSIS.search(command)]
  return found


def _all_commands():
  commands = []
  for source in DOCS + DOCSTRINGS:
    commands += _commands(source, open(os.path.join(ROOT, source), encoding="utf-8").read())
  return commands


COMMANDS = _all_commands()

# Run in a fresh interpreter per module: imports the module (which defines its
# flags), then parses each command's arguments the way the module does.
_PARSER = r"""
import importlib, json, sys
from absl import flags

module_name, commands = json.loads(sys.stdin.read())
module = importlib.import_module(module_name)
FLAGS = flags.FLAGS
results = []
for argv, partial in commands:
  try:
    if module_name == "bertjax.tools.evaluate_squad":
      if not partial:
        module._parse_args(argv)
      results.append(None)
      continue
    FLAGS.unparse_flags()
    for name in [name for name in FLAGS if name.startswith("config.")]:
      delattr(FLAGS, name)  # config_flags defines the overrides of each parse anew
    sys.argv = [module_name] + argv  # config_flags finds the --config.* overrides there
    try:
      FLAGS([module_name] + argv)
    except flags.IllegalFlagValueError as e:
      if not (partial and "must have a value other than None" in str(e)):
        raise
    if "config" in FLAGS and FLAGS["config"].present and not isinstance(FLAGS.config, str):
      from bertjax import tasks
      config = FLAGS.config
      if config.task not in tasks.TASKS:
        raise ValueError(f"config.task {config.task!r} is not a task")
      from bertjax import config_ranges, schedule_fit
      # As the command's own parsing refuses.
      refused = config_ranges.out_of_range(config) or schedule_fit.misfit(config)
      if refused:
        raise ValueError(refused)
    results.append(None)
  except BaseException as e:  # argparse exits; absl raises
    results.append(f"{type(e).__name__}: {e}")
print("RESULTS" + json.dumps(results))
"""


def _module_commands():
  by_module = {}
  for source, command, partial in COMMANDS:
    words = shlex.split(command, comments=True)
    if words[0] == "time":
      words = words[1:]
    if words[:2] == ["python", "-m"]:
      # "..." stands for flags left out: check the ones given.
      by_module.setdefault(words[2], []).append(
          (source, command, [w for w in words[3:] if w != "..."], partial or "..." in words))
  return by_module


MODULE_COMMANDS = _module_commands()


@pytest.mark.parametrize("module", sorted(MODULE_COMMANDS))
def test_module_commands_parse(module):
  commands = MODULE_COMMANDS[module]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  result = subprocess.run(
      [sys.executable, "-c", _PARSER], input=json.dumps(
          [module, [(argv, partial) for _, _, argv, partial in commands]]),
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert "RESULTS" in result.stdout, result.stderr[-3000:]
  results = json.loads(result.stdout.split("RESULTS", 1)[1])
  failures = [f"{source}: {command}\n  -> {error}"
              for (source, command, _, _), error in zip(commands, results) if error]
  assert not failures, "\n".join(failures)


# Lines no test here can run: acting on a Google Cloud project, marked so in
# the docs themselves; and the xpk lines tests/launch/test_xpk.py checks (the
# version pinned, its telemetry setting run, the cluster command's dry run).
REAL_PROJECT = "# needs a real project"
CHECKED_WITH_XPK = re.compile(r"^(python3 -m venv ~/xpk && ~/xpk/bin/pip install xpk==|"
                              r"export PATH=\"\$HOME/xpk/bin:\$PATH\"|"
                              r"xpk config set send-telemetry false)")
# The README's set-up line, run below and by .ci/run, word for word.
VENV_SETUP = "python3 -m venv .venv && . .venv/bin/activate"


def test_every_shell_line_is_a_checked_command():
  """A line of a shell block that no rule here understands fails, rather than
  going unchecked."""
  strays = []
  for source in DOCS:
    text = open(os.path.join(ROOT, source), encoding="utf-8").read()
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
      strays += [f"{source}: {line}" for line in _lines(block)
                 if line and not line.startswith("#") and not COMMAND_START.match(line)
                 and not line.endswith(REAL_PROJECT) and not CHECKED_WITH_XPK.match(line)
                 and line != VENV_SETUP]
  assert not strays, "\n".join(strays)
  assert len(MODULE_COMMANDS["bertjax.main"]) >= 20  # the extraction finds them


def test_the_set_up_line_makes_and_enters_a_virtual_environment(tmp_path):
  readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  assert f"```bash\n{VENV_SETUP}\n```" in readme
  ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
  assert "python3 -m venv .venv\n" in ci and "\n. .venv/bin/activate\n" in ci
  result = subprocess.run(["bash", "-c", f"{VENV_SETUP} && python -c 'import sys; "
                           "print(sys.prefix, sys.version_info >= (3, 11))'"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert result.stdout.split() == [str(tmp_path / ".venv"), "True"], result.stderr


def test_docker_commands_build_the_recipe_there_is():
  commands = [shlex.split(c) for _, c, _ in COMMANDS if c.startswith("docker build")]
  assert commands
  for words in commands:
    assert os.path.isfile(os.path.join(ROOT, words[words.index("-f") + 1])), words
    assert words[-1] == "."  # the repository root is the build context


def test_a_bad_override_or_flag_is_caught():
  """The checks above fail on the mistakes they exist for."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  bad = [(["--config=configs/glue.py:mrpc", "--workdir=/tmp/x",
           "--config.train.batchsize=8"], False),
         (["--config=configs/glue.py:nosuchtask", "--workdir=/tmp/x"], False),
         (["--config=configs/demo.py"], False)]
  result = subprocess.run([sys.executable, "-c", _PARSER],
                          input=json.dumps(["bertjax.main", bad]), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  results = json.loads(result.stdout.split("RESULTS", 1)[1])
  assert "batchsize" in results[0]
  assert "nosuchtask" in results[1]
  assert "workdir" in results[2]


def test_benchmark_script_commands_use_its_flags():
  source = open(os.path.join(ROOT, "benchmarks", "peer_flags.py"), encoding="utf-8").read()
  # The peers' flags are defined in a loop over (name, default) pairs.
  defined = {f"--{name}" for name in re.findall(r"\(\"(\w+)\", (?:\d+|None)\)", source)}
  commands = [c for _, c, _ in COMMANDS if c.startswith(("python benchmarks/hf_flax_bert.py",
                                                          "python benchmarks/hf_torch_bert.py"))]
  assert len({c.split()[1] for c in commands}) == 2
  for command in commands:
    used = {w.split("=")[0] for w in shlex.split(command) if w.startswith("--")}
    assert used <= defined, (command, used - defined)


def test_pip_extras_exist():
  setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
  extras = set(re.findall(r"^    \"(\w+)\": \[", setup, re.M))
  assert {"test", "tf", "tpu", "gpu"} <= extras
  commands = [c for _, c, _ in COMMANDS if c.startswith("pip install")]
  assert commands
  for command in commands:
    for spec in shlex.split(command)[2:]:
      match = re.fullmatch(r"\.\[([\w,]+)\]", spec)
      if match:
        assert set(match.group(1).split(",")) <= extras, command


def test_launch_commands_dry_run(tmp_path):
  """Each documented launch command prints its gcloud commands in a dry run, in
  the environment its document's `export` lines set up."""
  checked = 0
  for source in DOCS:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTJAX_")}
    for _, command, partial in _commands(source, open(os.path.join(ROOT, source)).read()):
      words = shlex.split(command, comments=True)
      if words[0] == "export":
        env.update(word.split("=", 1) for word in words[1:])
      elif words[0].startswith("launch/") and not partial:
        flags_end = words.index("--") if "--" in words else len(words)
        argv = words[:flags_end] + ["--dry-run"] + words[flags_end:]
        if words[0] == "launch/xpk.sh":  # the real xpk's dry run
          from tests.launch.xpk_env import xpk_executable

          xpk = xpk_executable()
          if xpk is None:
            continue
          env = {**env, "BERTJAX_XPK": xpk}
        result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"{source}: {command}\n{result.stderr}"
        assert "gcloud " in result.stdout, f"{source}: {command}\n{result.stdout}"
        checked += 1
  assert checked >= 8


ENTRY_POINTS = ["bertjax.main", *sorted(
    f"bertjax.tools.{os.path.basename(p)[:-3]}"
    for p in glob.glob(os.path.join(ROOT, "bertjax", "tools", "*.py"))
    if not p.endswith("__init__.py"))]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_explains_the_entry_point(module):
  """`--help` alone says what the command does, shows it in use and lists every
  flag the module defines."""
  path = os.path.join(ROOT, *module.split(".")) + ".py"
  source = open(path, encoding="utf-8").read()
  docstring = ast.get_docstring(ast.parse(source))
  own_flags = re.findall(r"(?:flags|config_flags)\.DEFINE_\w+\(\s*\"(\w+)\"", source)
  own_flags += re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source)
  assert own_flags, module
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  # absl's --help exits with 1 (argparse's with 0); either way, no traceback.
  assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert docstring.splitlines()[0] in result.stdout
  assert f"python -m {module}" in result.stdout  # an example
  for name in own_flags:
    assert name in result.stdout, (module, name)
