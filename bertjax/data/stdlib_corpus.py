"""The demo corpus: this Python's standard library docstrings and help topics,
parsed from its source files (no import, no download), one document per
module or topic: an offline English corpus of a few hundred thousand
WordPiece tokens on any machine (`demo:stdlib`)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import sysconfig
from typing import Iterator

from bertjax.data.corpus import Document
from bertjax.data.sentences import split_sentences


def stdlib_documents() -> Iterator[Document]:
  """The standard library's docstrings, one document per module: the demo corpus.

  Parsed once per process and kept (a few MB).

  Source files are parsed, never imported. A module's document is its
  docstrings (module, classes, functions) in source order, so consecutive
  sentences share a topic, as next-sentence prediction needs. Test packages,
  doctest examples and indented code are left out.
  """
  return iter(_stdlib_documents())


@functools.lru_cache(maxsize=1)
def _stdlib_documents() -> tuple[Document, ...]:
  return tuple(_parse_stdlib())


def _parse_stdlib() -> Iterator[Document]:
  # One document per file, and one per help topic.
  key, document = None, []
  for docstring in stdlib_docstrings():
    if docstring.document != key:
      if document:
        yield document
      key, document = docstring.document, []
    document += docstring.sentences
  if document:
    yield document


# The language reference's help topics, as a file of the standard library.
TOPICS = "pydoc_data/topics.py"


@dataclasses.dataclass(frozen=True)
class Docstring:
  """One docstring's prose.

  Attributes:
    module: Its file, relative to the standard library's directory
      ("email/message.py"), or "pydoc_data/topics.py" for a help topic.
    name: Its place in the file: "" for the module's own docstring, the
      qualified name of its class or function ("Message.get_payload"), or the
      help topic ("if").
    sentences: Its sentences of prose (at least one).
  """

  module: str
  name: str
  sentences: list[str]

  @property
  def document(self) -> str:
    """The demo corpus document it belongs to: its file, or its help topic."""
    return f"{self.module}:{self.name}" if self.module == TOPICS else self.module


def stdlib_docstrings() -> Iterator[Docstring]:
  """Every docstring of the standard library with prose in it, file by file.

  Files in sorted order, each file's docstrings in source order (module,
  classes, functions); then the language reference's help topics (what
  `help("if")` shows), one docstring per topic. Test packages and files that
  do not parse are left out.
  """
  root = sysconfig.get_paths()["stdlib"]
  skipped_parts = {"test", "tests", "idle_test", "site-packages", "dist-packages",
                   "lib2to3", "__pycache__", "turtledemo"}
  paths = []
  for directory, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in skipped_parts)
    paths += [os.path.join(directory, f) for f in sorted(files) if f.endswith(".py")]
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    module = os.path.relpath(path, root).replace(os.sep, "/")
    for name, node in sorted(_named_nodes(tree), key=lambda item: getattr(item[1], "lineno", 0)):
      sentences = _prose_sentences(ast.get_docstring(node) or "")
      if sentences:
        yield Docstring(module, name, sentences)
  topics_path = os.path.join(root, TOPICS)
  if os.path.isfile(topics_path):
    with open(topics_path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in tree.body:
      if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
        for key, value in zip(node.value.keys, node.value.values):
          if isinstance(value, ast.Constant) and isinstance(value.value, str):
            sentences = _prose_sentences(value.value)
            if sentences:
              topic = key.value if isinstance(key, ast.Constant) else ""
              yield Docstring(TOPICS, str(topic), sentences)


def _named_nodes(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
  """(qualified name, node) of the module and its classes and functions."""
  yield "", tree
  stack: list[tuple[str, ast.AST]] = [("", tree)]
  while stack:
    prefix, parent = stack.pop()
    for node in ast.iter_child_nodes(parent):
      if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        name = f"{prefix}{node.name}"
        yield name, node
        stack.append((f"{name}.", node))
      elif not isinstance(node, ast.expr):
        stack.append((prefix, node))  # inside an if, a try, a with: same scope


def _prose_sentences(docstring: str) -> list[str]:
  prose = []
  for line in docstring.splitlines():
    stripped = line.strip()
    if (line.startswith((" ", "\t")) or stripped.startswith((">>>", "...", "..", ":"))
        or stripped.endswith("::")):
      prose.append("")  # code, examples and markup end a paragraph
    else:
      prose.append(stripped)
  paragraphs = " ".join(p if p else "\n" for p in prose).split("\n")
  # Keep sentences of at least three words, mostly letters (not rules of "***").
  return [s for paragraph in paragraphs for s in split_sentences(paragraph)
          if len(s.split()) >= 3 and sum(c.isalpha() for c in s) >= len(s) / 2]
