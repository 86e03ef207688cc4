"""Telling a corpus of one document a line from one of sentences, before a build.

Read one sentence a line (the default), a corpus of one document a line, the
commonest export, would be built as one document. The builder looks at the
first few input files before any work (`check_sentence_files`) and refuses one
whose first document looks like whole documents, one a line: no blank line in
its first `ONE_DOCUMENT_LINES` lines, and a median line of several sentences.
A book or a long article written one sentence a line (as BookCorpus is) has
as long a run of lines without a blank one, but of one sentence each: it is
built as written.
"""

from __future__ import annotations

import statistics

from bertjax import errors
from bertjax.data import corpus, textfiles
from bertjax.data.sentences import split_sentences

# A file whose first this many lines hold no blank line is looked at closer
# (read to its first blank line: a file of sentences costs its first document).
ONE_DOCUMENT_LINES = 1000
# ... and refused when its median line holds this many sentences or more, by
# the builder's own splitter (of each line's first 4 KiB): a sentence a line
# holds one (two where the splitter takes an abbreviation for an end), a
# document (an article, a story) a line holds a paragraph's worth or more.
DOCUMENT_SENTENCES = 3
_FILES_LOOKED_AT = 3


class OneDocumentALineError(errors.UsageError):
  """An input file to be read one sentence a line that looks like one document
  a line (`check_sentence_files`).

  Attributes:
    path: The file.
    sentences: The median sentences a line of its first lines.
  """

  def __init__(self, path: str, sentences: float):
    self.path, self.sentences = path, sentences
    super().__init__(self.message("--file_format"))

  def message(self, flag: str) -> str:
    """The refusal, naming `flag` (the command's way to give the file format)."""
    return (f"{self.path}: its first {ONE_DOCUMENT_LINES:,} lines hold no blank line and a "
            f"median of {self.sentences:g} sentences a line, so it looks like one document a "
            "line (the usual export), which read one sentence a line would be a single "
            f"document; pass {flag}=documents to read one document a line, or "
            f"{flag}=sentences if it is one sentence a line")


def check_sentence_files(inputs: list[corpus.InputFile]) -> None:
  """Refuses input to be read one sentence a line whose first files look like
  one document a line.

  Raises:
    OneDocumentALineError: naming the file and the `--file_format` for either reading.
  """
  for file in inputs[:_FILES_LOOKED_AT]:
    lines = textfiles.first_document(file.path, file.compression, file.encoding,
                                     ONE_DOCUMENT_LINES)
    if len(lines) < ONE_DOCUMENT_LINES:
      continue
    median = statistics.median(len(split_sentences(line)) for line in lines)
    if median >= DOCUMENT_SENTENCES:
      raise OneDocumentALineError(file.path, median)


def check_input(spec: str) -> None:
  """`check_sentence_files` of an input spec's files (none of a `demo:` or
  `tfds:` spec): before a vocabulary is trained on it."""
  if not spec.startswith(("demo:", "tfds:")):
    check_sentence_files(corpus.scan_files(corpus.expand_inputs(spec), corpus.CorpusStats()))
