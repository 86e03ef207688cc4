"""The demo's fine-tuning task: which part of the standard library a sentence documents.

An offline sentence-classification task built from the demo corpus (the
standard library's docstrings, `bertjax.data.stdlib_corpus`), so the demo's
model can be fine-tuned and scored on any machine: each sentence is labelled
with the area of the library it comes from, following the chapters of the
Python Library Reference (merged to seven). Modules outside these chapters,
and the language reference's help topics, are left out.

Train and dev are split by docstring (one docstring in eight is dev), so a
dev sentence's neighbours are never in training. A sentence that occurs more
than once in the task (boilerplate such as "Return the value.") is left out
wherever it occurs, so no sentence is in both splits or has two labels.
The examples follow this Python's standard library, so their number varies a
little between Python versions.
"""

from __future__ import annotations

import collections
import functools
import hashlib

from bertjax import errors
from bertjax.data import glue, stdlib_corpus

# Label -> the top-level modules and packages in it (the Library Reference's
# chapters: "internet" is Internet Data Handling, Internet Protocols and
# sockets; "text" is Text Processing, Structured Markup and File Formats;
# "files" is File and Directory Access and Data Compression and Archiving;
# "development" is Development Tools and Debugging and Profiling).
AREAS: dict[str, tuple[str, ...]] = {
    "internet": ("email", "http", "urllib", "smtplib", "imaplib", "poplib", "ftplib",
                 "mailbox", "mimetypes", "json", "xmlrpc", "wsgiref", "socketserver", "socket",
                 "ssl", "webbrowser", "ipaddress", "nntplib", "telnetlib", "cgi", "uuid"),
    "concurrency": ("asyncio", "multiprocessing", "threading", "concurrent", "queue",
                    "subprocess", "sched", "selectors", "contextvars"),
    "text": ("re", "string", "textwrap", "difflib", "stringprep", "html", "xml", "csv",
             "configparser", "tomllib", "plistlib", "netrc"),
    "files": ("pathlib", "fileinput", "filecmp", "tempfile", "glob", "fnmatch", "linecache",
              "shutil", "zipfile", "tarfile", "gzip", "bz2", "lzma", "_pyio"),
    "numbers": ("numbers", "_pydecimal", "decimal", "fractions", "random", "statistics"),
    "development": ("typing", "pydoc", "doctest", "unittest", "bdb", "pdb", "profile",
                    "cProfile", "pstats", "timeit", "trace"),
    "gui": ("tkinter", "idlelib", "turtle"),
}
NAME = "stdlib_topics"
# Laid out as GLUE's single-sentence tasks, so the GLUE task runs it; no test set.
SPEC = glue.TaskSpec(NAME, tuple(AREAS), {"train": "train.tsv", "dev": "dev.tsv"},
                     header=True, columns=(0, None, 1), test_columns=(1, None),
                     tfds_name="", tfds_features=("sentence", None), submission={})
DEV_ONE_IN = 8  # docstrings


def read_split(split: str) -> list[glue.Example]:
  """The task's "train" or "dev" examples, in the standard library's order."""
  if split not in SPEC.files:
    raise errors.UsageError(f"the {NAME} task has splits {', '.join(SPEC.files)}, not {split!r}")
  return list(_examples()[split])


@functools.lru_cache(maxsize=1)
def _examples() -> dict[str, tuple[glue.Example, ...]]:
  area_of = {module: area for area, modules in AREAS.items() for module in modules}
  labelled = []  # (split, sentence, label)
  for docstring in stdlib_corpus.stdlib_docstrings():
    top = docstring.module.split("/")[0].removesuffix(".py")
    if top not in area_of:
      continue
    key = f"{docstring.module}:{docstring.name}".encode()
    dev = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % DEV_ONE_IN == 0
    labelled += [("dev" if dev else "train", s, area_of[top]) for s in docstring.sentences]
  times = collections.Counter(sentence for _, sentence, _ in labelled)
  examples: dict[str, list[glue.Example]] = {"train": [], "dev": []}
  for split, sentence, label in labelled:
    if times[sentence] == 1:
      index = len(examples[split])
      examples[split].append(glue.Example(f"{split}-{index}", sentence, None, label, index))
  return {split: tuple(rows) for split, rows in examples.items()}
