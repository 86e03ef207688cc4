"""The demo corpus: this Python's standard library docstrings and help topics,
parsed from its source files (no import, no download), one document per
module or topic: an offline English corpus of a few hundred thousand
WordPiece tokens on any machine (`demo:stdlib`)."""

from __future__ import annotations

import ast
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
    nodes = [node for node in ast.walk(tree) if isinstance(
        node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes.sort(key=lambda node: getattr(node, "lineno", 0))
    document = [sentence for node in nodes
                for sentence in _prose_sentences(ast.get_docstring(node) or "")]
    if document:
      yield document
  # The language reference's help topics (what `help("if")` shows), one
  # document per topic.
  topics_path = os.path.join(root, "pydoc_data", "topics.py")
  if os.path.isfile(topics_path):
    with open(topics_path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in tree.body:
      if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
        for key, value in zip(node.value.keys, node.value.values):
          if isinstance(value, ast.Constant) and isinstance(value.value, str):
            document = _prose_sentences(value.value)
            if document:
              yield document


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
