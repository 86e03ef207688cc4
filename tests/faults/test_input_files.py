"""Hostile input files: each is refused with a message naming the file and the
place in it, or skipped and counted in the reader's summary; none is read as
data.

SQuAD JSON, GLUE STS-B scores, safetensors headers and the shard names of a
`model.safetensors.index.json`; text files as people save them (a UTF-8
byte-order mark, CRLF line ends) in every text input; lines of any length read
in bounded memory.
"""

import codecs
import gzip
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import glue, squad
from bertjax.data.skips import SkipReport
from bertjax.interop import hf
from bertjax.tools import evaluate_squad

CONTEXT = "The Normans were the people who gave their name to Normandy, a region in France."
START = CONTEXT.index("Normandy")


def _squad(tmp_path, qa=None, paragraph=None, data=None, name="train.json"):
  """A SQuAD file with one article ("Normans") of one paragraph: a good
  question, then `qa` (a question with id "bad"), fields of `paragraph`
  replaced; or `data` as the whole file."""
  if data is None:
    good = {"id": "good", "question": "What region?",
            "answers": [{"text": "Normandy", "answer_start": START}]}
    body = {"context": CONTEXT, "qas": [good] + ([qa] if qa else [])}
    body.update(paragraph or {})
    data = {"version": "1.1", "data": [{"title": "Normans", "paragraphs": [body]}]}
  path = tmp_path / name
  path.write_text(json.dumps(data))
  return str(path)


def _located_error(path, is_training, *places):
  with pytest.raises(ValueError) as error:
    squad.read_examples(path, is_training=is_training)
  message = str(error.value)
  assert "\n" not in message
  for place in (path, *places):
    assert place in message, (place, message)
  return message


@pytest.mark.parametrize("is_training", [True, False])
def test_squad_null_context_names_the_paragraph(tmp_path, is_training):
  path = _squad(tmp_path, paragraph={"context": None})
  message = _located_error(path, is_training, "data[0].paragraphs[0]", "Normans", "'context'")
  assert "null" in message


@pytest.mark.parametrize("question", [42, None, ["What", "region?"]])
@pytest.mark.parametrize("is_training", [True, False])
def test_squad_question_that_is_not_text_names_the_question(tmp_path, question, is_training):
  path = _squad(tmp_path, qa={"id": "bad", "question": question,
                              "answers": [{"text": "France", "answer_start": 73}]})
  _located_error(path, is_training, "data[0].paragraphs[0].qas[1]", "Normans", "bad",
                 "'question'")


@pytest.mark.parametrize("data", [{"version": "1.1"}, {"version": "1.1", "data": None},
                                  {"data": {"title": "Normans"}}])
def test_squad_without_a_data_list_names_the_file(tmp_path, data):
  path = _squad(tmp_path, data=data)
  _located_error(path, True, '"data"')


@pytest.mark.parametrize("start", ["73", 73.0, True])
def test_squad_answer_start_that_is_not_an_integer_names_the_question(tmp_path, start):
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": "France", "answer_start": start}]})
  message = _located_error(path, True, "qas[1]", "Normans", "bad", "answer_start")
  assert repr(start) in message or json.dumps(start) in message


@pytest.mark.parametrize("text", ["   ", "\t\n", ""])
def test_squad_blank_answer_is_skipped_and_counted(tmp_path, text):
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": text, "answer_start": 3}]})
  report = SkipReport()
  examples = squad.read_examples(path, is_training=True, report=report)
  assert [e.qas_id for e in examples] == ["good"]
  assert report.total == 1
  (reason,) = report.counts
  assert "blank" in reason
  assert "qas[1]" in report.examples[0] and "bad" in report.examples[0]


def test_squad_answer_text_that_is_not_a_string_names_the_question(tmp_path):
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": 5, "answer_start": 73}]})
  _located_error(path, False, "qas[1]", "bad", "'text'")


def test_squad_is_impossible_that_is_not_a_boolean_names_the_question(tmp_path):
  # bool("false") is True: read as it stood, the question became unanswerable.
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?", "is_impossible": "false",
                              "answers": [{"text": "France", "answer_start": 73}]})
  _located_error(path, True, "qas[1]", "bad", "is_impossible")


def test_evaluate_squad_names_the_malformed_question(tmp_path, capsys):
  data = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": 5, "answer_start": 73}]}, name="dev.json")
  predictions = tmp_path / "predictions.json"
  predictions.write_text(json.dumps({"good": "Normandy", "bad": "France"}))
  with pytest.raises(SystemExit) as error:
    evaluate_squad.main([data, str(predictions)])
  assert error.value.code == 2
  message = capsys.readouterr().err
  assert message.startswith("error: ") and data in message and "qas[1]" in message
  assert "bad" in message and "'text'" in message


STSB_HEADER = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
               "sentence2\tscore")


def test_stsb_scores_that_are_not_finite_or_outside_0_to_5_are_skipped_and_counted(tmp_path):
  scores = ["3.2", "nan", "inf", "-inf", "NaN", "5.5", "-0.5", "5.000", "0"]
  lines = [STSB_HEADER] + [f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\tA man.\tA dog.\t{s}"
                           for i, s in enumerate(scores)]
  (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
  report = SkipReport(keep_examples=10)
  examples = glue.read_tsv(glue.task_spec("stsb"), str(tmp_path), "train", report=report)
  assert [e.label for e in examples] == [3.2, 5.0, 0.0]
  assert report.total == 6
  assert sorted(report.counts.values()) == [2, 4]
  path = tmp_path / "train.tsv"
  located = [example.split(": ")[0] for example in report.examples]
  assert located == [f"{path}:{line}" for line in (3, 4, 5, 6, 7, 8)]


def _safetensors(path, header, data=b""):
  raw = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
  return str(path)


SIXTEEN_BYTES = np.arange(4, dtype=np.float32).tobytes()


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]},  # (-2) * (-2) * 4 = 16
    {"dtype": "F32", "shape": [-4], "data_offsets": [16, 0]},  # -4 * 4 = 0 - 16
    {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4], "data_offsets": [0.0, 16.0]},
    # Reaches back into the header: 16 bytes, but 8 of them are not the tensor's.
    {"dtype": "F32", "shape": [4], "data_offsets": [-8, 8]},
])
def test_malformed_safetensors_entry_names_file_and_tensor(tmp_path, entry):
  path = _safetensors(tmp_path / "model.safetensors", {"bert.pooler.dense.bias": entry},
                      SIXTEEN_BYTES)
  with pytest.raises(ValueError) as error:
    hf.read_safetensors(path)
  message = str(error.value)
  assert path in message and "bert.pooler.dense.bias" in message, message


def _sharded_directory(tmp_path, shard_name):
  """A model directory whose index names `shard_name`, with a readable
  safetensors file at the place that name points to."""
  model = tmp_path / "model"
  (model / "sub").mkdir(parents=True)
  outside = tmp_path / "outside.safetensors"
  _safetensors(outside, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
               SIXTEEN_BYTES)
  name = str(outside) if shard_name == "ABSOLUTE" else shard_name
  (model / hf.SAFETENSORS_INDEX_FILE).write_text(json.dumps(
      {"metadata": {}, "weight_map": {"w": name}}))
  return str(model), name


@pytest.mark.parametrize("shard_name", ["../outside.safetensors", "ABSOLUTE",
                                        "sub/../../outside.safetensors"])
def test_index_naming_a_shard_outside_the_model_directory_is_refused(tmp_path, shard_name):
  directory, name = _sharded_directory(tmp_path, shard_name)
  with pytest.raises(ValueError) as error:
    hf.read_weights(directory)
  message = str(error.value)
  assert hf.SAFETENSORS_INDEX_FILE in message and name in message, message


@pytest.mark.parametrize("saved_as", ["bom", "crlf", "bom+crlf"])
def test_a_vocabulary_saved_on_another_system_reads_as_the_original(tmp_path, saved_as):
  """A vocab.txt with a UTF-8 byte-order mark or CRLF line ends (a Windows
  editor's save) has the same tokens, so the same ids, as the original."""
  from bertjax.data.tokenizers import WordPieceTokenizer, read_vocab
  from tests import reference

  original = tmp_path / "vocab.txt"
  reference.write_vocab(str(original))
  text = original.read_text(encoding="utf-8")
  if "crlf" in saved_as:
    text = text.replace("\n", "\r\n")
  saved = tmp_path / f"{saved_as}.txt"
  saved.write_bytes(("\ufeff" if "bom" in saved_as else "").encode() + text.encode("utf-8"))
  assert read_vocab(str(saved)) == read_vocab(str(original))
  assert read_vocab(str(saved))[0] == "[PAD]"
  sentence = "the quick brown fox jumps over the lazy dog"
  assert (WordPieceTokenizer(str(saved)).encode(sentence)
          == WordPieceTokenizer(str(original)).encode(sentence))


def test_json_and_text_files_saved_with_a_byte_order_mark_read_as_without(tmp_path):
  """config.json, tokenizer and model settings edited in a Windows editor."""
  from bertjax import files

  path = tmp_path / "config.json"
  path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"hidden_size": 32}).encode())
  assert files.read_json(str(path)) == {"hidden_size": 32}
  assert files.read_text(str(path)) == json.dumps({"hidden_size": 32})


def _saved_as(text: str, saved_as: str) -> bytes:
  """`text` as an editor on another system saves it: "bom", "crlf" or "bom+crlf"."""
  if "crlf" in saved_as:
    text = text.replace("\n", "\r\n")
  return ("\ufeff" if "bom" in saved_as else "").encode() + text.encode("utf-8")


SAVED_AS = ["bom", "crlf", "bom+crlf"]


@pytest.mark.parametrize("saved_as", SAVED_AS)
@pytest.mark.parametrize("file_format", ["sentences", "documents"])
@pytest.mark.parametrize("compressed", [False, True])
def test_a_corpus_saved_with_a_byte_order_mark_reads_as_without(tmp_path, saved_as, file_format,
                                                                 compressed):
  """The mark is not the first sentence's first character, whether the file is
  read in byte ranges or whole (compressed)."""
  from bertjax.data import corpus

  text = "First sentence here.\nSecond one.\n\nThird, in a new document.\n"
  data = _saved_as(text, saved_as)
  path = tmp_path / ("corpus.txt.gz" if compressed else "corpus.txt")
  path.write_bytes(gzip.compress(data) if compressed else data)
  expected = ([["First sentence here.", "Second one."], ["Third, in a new document."]]
              if file_format == "sentences" else
              [["First sentence here."], ["Second one."], ["Third, in a new document."]])
  stats = corpus.CorpusStats()
  files = corpus.scan_files([str(path)], stats)
  for parts in (1, 2, 5, len(data)):
    documents = [document for part in corpus.plan_ranges(files, parts) for file_range in part
                 for document in corpus.read_range(file_range, file_format, stats)]
    assert documents == expected, parts
  assert not stats.lines_skipped and not stats.documents_skipped


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 9])
def test_a_corpus_whose_first_line_is_only_a_byte_order_mark_loses_no_document(tmp_path, parts):
  """The mark's line is blank to every byte range: the document after it is
  read once, by the range it starts in, not dropped as the tail of another."""
  from bertjax.data import corpus

  path = tmp_path / "corpus.txt"
  path.write_bytes(b"\xef\xbb\xbf\nOne.\nTwo.\n\nThree.\n")
  stats = corpus.CorpusStats()
  documents = [document for part in corpus.plan_ranges(corpus.scan_files([str(path)], stats),
                                                       parts)
               for file_range in part
               for document in corpus.read_range(file_range, "sentences", stats)]
  assert documents == [["One.", "Two."], ["Three."]]


def test_a_vocabulary_is_trained_without_the_byte_order_mark(tmp_path):
  from bertjax.data import vocabulary

  path = tmp_path / "corpus.txt"
  path.write_bytes(_saved_as("Hello world.\nAnother line.\n", "bom+crlf"))
  assert list(vocabulary.sentences(str(path))) == ["Hello world.", "Another line."]


@pytest.mark.parametrize("saved_as", SAVED_AS)
def test_squad_json_saved_on_another_system_reads_as_the_original(tmp_path, saved_as):
  original = _squad(tmp_path)
  saved = tmp_path / "saved.json"
  saved.write_bytes(_saved_as(json.dumps(json.loads(open(original).read()), indent=1), saved_as))
  examples = squad.read_examples(str(saved), is_training=True)
  assert examples == squad.read_examples(original, is_training=True)
  assert [e.qas_id for e in examples] == ["good"]


def test_evaluate_squad_reads_files_saved_with_a_byte_order_mark(tmp_path, capsys):
  data = tmp_path / "dev.json"
  data.write_bytes(_saved_as(open(_squad(tmp_path)).read(), "bom+crlf"))
  predictions = tmp_path / "predictions.json"
  predictions.write_bytes(_saved_as(json.dumps({"good": "Normandy"}), "bom"))
  evaluate_squad.main([str(data), str(predictions)])
  assert json.loads(capsys.readouterr().out)["exact_match"] == 100.0


GLUE_FILES = {
    # CoLA's train file has no header: the mark would stick to its first row.
    ("cola", "train"): "gj04\t1\t\tOur friends won't buy this analysis.\n"
                       "gj04\t0\t*\tThey drank the pub.\n",
    ("sst2", "dev"): "sentence\tlabel\nit 's a charming journey . \t1\nunfunny . \t0\n",
    ("stsb", "train"): STSB_HEADER + "\n0\tmain\tMSRvid\t2012\t0001\tnone\tnone\tA plane.\t"
                       "An air plane.\t5.000\n",
    # Test rows are identified by their index column, the first.
    ("mrpc", "test"): "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t1\t2\tA b.\tC d.\n"
                      "1\t3\t4\tE f.\tG h.\n",
}


@pytest.mark.parametrize("saved_as", SAVED_AS)
@pytest.mark.parametrize("task,split", list(GLUE_FILES))
def test_glue_tsv_saved_on_another_system_reads_as_the_original(tmp_path, saved_as, task, split):
  """No byte-order mark before the first column, no CR after the last (a label
  or score)."""
  spec = glue.task_spec(task)
  name = spec.files[split]
  (tmp_path / "original").mkdir()
  (tmp_path / "saved").mkdir()
  (tmp_path / "original" / name).write_text(GLUE_FILES[task, split])
  (tmp_path / "saved" / name).write_bytes(_saved_as(GLUE_FILES[task, split], saved_as))
  saved = glue.read_tsv(spec, str(tmp_path / "saved"), split)
  assert saved == glue.read_tsv(spec, str(tmp_path / "original"), split)
  assert not any("\ufeff" in e.text_a or "\r" in str(e.text_b) + str(e.label) for e in saved)


SWAG_FILE = ("sent1,sent2,ending0,ending1,ending2,ending3,label\n"
             "The dog,runs,far.,away.,home.,back.,2\n")


@pytest.mark.parametrize("saved_as", SAVED_AS)
def test_swag_csv_saved_on_another_system_reads_as_the_original(tmp_path, saved_as):
  """The header's first name (sent1 here) is found: the mark is not part of it."""
  from bertjax.data import swag

  path = tmp_path / "val.csv"
  path.write_bytes(_saved_as(SWAG_FILE, saved_as))
  (example,) = swag.read_csv(str(path))
  assert (example.context, example.endings[3], example.label) == ("The dog", "back.", 2)


CONLL_FILE = ("-DOCSTART- -X- -X- O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n\n"
              "-DOCSTART- -X- -X- O\n\nPeter NNP I-NP I-PER\n")


@pytest.mark.parametrize("saved_as", SAVED_AS)
def test_conll_file_saved_on_another_system_reads_as_the_original(tmp_path, saved_as):
  """'-DOCSTART-' after a mark still starts a document (it is not a word),
  and a CRLF line's tag has no CR."""
  from bertjax.data import conll

  path = tmp_path / "eng.train"
  path.write_bytes(_saved_as(CONLL_FILE, saved_as))
  sentences = conll.read_conll(str(path))
  assert [(s.words, s.tags, s.document) for s in sentences] == [
      (["EU", "rejects"], ["I-ORG", "O"], 0), (["Peter"], ["I-PER"], 1)]


@pytest.mark.parametrize("saved_as", SAVED_AS)
def test_a_tokenizer_json_saved_with_a_byte_order_mark_reads_as_the_original(tmp_path, saved_as):
  """ModernBERT's tokenizer.json (read by the tokenizers library, to which the
  mark is no JSON) and its tokenizer_config.json."""
  from tests import reference

  reference.write_bpe_tokenizer(tmp_path / "original")
  (tmp_path / "saved").mkdir()
  for name in ("tokenizer.json", "tokenizer_config.json"):
    text = (tmp_path / "original" / name).read_text(encoding="utf-8")
    (tmp_path / "saved" / name).write_bytes(_saved_as(text, saved_as))
  sentence = "the cat sat on the mat"
  saved = hf.load_tokenizer(str(tmp_path / "saved"))
  assert saved.encode(sentence) == hf.load_tokenizer(str(tmp_path / "original")).encode(sentence)


@pytest.mark.parametrize("saved_as", SAVED_AS)
def test_a_tensorflow_checkpoint_file_saved_with_a_byte_order_mark_names_the_latest(tmp_path,
                                                                                   saved_as):
  """Its first line names the checkpoint to load among several."""
  from bertjax.interop import google_tf

  for step in (1000, 2000):
    (tmp_path / f"model.ckpt-{step}.index").write_bytes(b"")
  (tmp_path / "checkpoint").write_bytes(_saved_as(
      'model_checkpoint_path: "model.ckpt-1000"\n'
      'all_model_checkpoint_paths: "model.ckpt-1000"\n'
      'all_model_checkpoint_paths: "model.ckpt-2000"\n', saved_as))
  assert google_tf.find_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-1000")


def _read_glue(path):
  return glue.read_tsv(glue.task_spec("sst2"), str(path.parent), "dev")


def _read_swag(path):
  from bertjax.data import swag
  return swag.read_csv(str(path))


def _read_conll(path):
  from bertjax.data import conll
  return conll.read_conll(str(path))


def _read_vocab(path):
  from bertjax.data import tokenizers
  return tokenizers.read_vocab(str(path))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
@pytest.mark.parametrize("name,text,read", [
    ("dev.tsv", GLUE_FILES["sst2", "dev"], _read_glue),
    ("val.csv", SWAG_FILE, _read_swag),
    ("eng.train", CONLL_FILE, _read_conll),
    ("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", _read_vocab),
], ids=["glue", "swag", "conll", "vocab"])
def test_a_file_saved_as_utf16_or_utf32_is_named_as_such(tmp_path, encoding, name, text, read):
  """Excel's "Unicode Text" and Notepad's "Unicode" save UTF-16 after its
  byte-order mark: the one-line error names the encoding and the fix."""
  path = tmp_path / name
  path.write_bytes({"utf-16": codecs.BOM_UTF16_LE + text.encode("utf-16-le"),
                    "utf-16-be": codecs.BOM_UTF16_BE + text.encode("utf-16-be"),
                    "utf-32": codecs.BOM_UTF32_LE + text.encode("utf-32-le")}[encoding])
  with pytest.raises(ValueError) as error:
    read(path)
  message = str(error.value)
  expected = "UTF-32" if encoding == "utf-32" else "UTF-16"
  assert "\n" not in message and str(path) in message, message
  assert f"{expected} text (it starts with a {expected} byte-order mark)" in message, message
  assert "save it as UTF-8" in message, message


# Runs a reader in a fresh process (one that imports only the reader's module)
# and prints its result with the growth of the process's peak memory over a
# warm-up read of a small file. The peak is the kernel's VmHWM: getrusage's
# ru_maxrss survives exec, so it starts at the peak of the test process that
# forked it (pytest's, far above a reader's).
_PEAK_MEMORY = """
import json, sys
{reader}
def peak_mib():
  with open("/proc/self/status") as f:
    kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
  return kib / 1024
small, big, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
read(small, **args)
before = peak_mib()
result = read(big, **args)
print(json.dumps({{"growth_mib": peak_mib() - before, "result": result}}))
"""
_READ_CORPUS = """
from bertjax.data import corpus
def read(path, file_format, cuts):
  stats = corpus.CorpusStats()
  (file,) = corpus.scan_files([path], stats)
  bounds = [0] + [cut for cut in cuts if cut < file.size] + [file.size]
  documents = [document for start, end in zip(bounds, bounds[1:])
               for document in corpus.read_range(corpus.FileRange(path, start, end, file.size),
                                                 file_format, stats)]
  return {"documents": documents, "lines_skipped": stats.lines_skipped,
          "documents_skipped": stats.documents_skipped}
"""
_READ_CONLL = """
from bertjax.data import conll
from bertjax.data.skips import SkipReport
def read(path):
  report = SkipReport()
  sentences = conll.read_conll(path, report)
  return {"words": [s.words for s in sentences], "skipped": report.counts}
"""
LONG_LINE_BYTES = 100 << 20
# Far less than the line: reading it whole would grow the peak by its size
# (and more, to decode or split it).
MEMORY_GROWTH_LIMIT_MIB = 30


def _peak_memory(reader: str, small, big, **args) -> dict:
  script = _PEAK_MEMORY.format(reader=reader)
  try:
    done = subprocess.run([sys.executable, "-c", script, str(small), str(big), json.dumps(args)],
                          capture_output=True, text=True, timeout=60)
  except subprocess.TimeoutExpired:
    pytest.fail("reading the long line took over a minute")
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout)


def _write_long_line(f, character: str) -> None:
  """A line of `LONG_LINE_BYTES` bytes of `character`, without its newline,
  written a MiB at a time."""
  piece = character.encode("utf-8")
  chunk = piece * ((1 << 20) // len(piece))
  written = 0
  while written + len(chunk) <= LONG_LINE_BYTES:
    f.write(chunk)
    written += len(chunk)
  f.write(piece * ((LONG_LINE_BYTES - written) // len(piece)))


HEAD = b"One.\nTwo.\n\n"  # before the long line
TAIL = b"\nThree.\n\nFour.\n"  # the long line's newline, then after it


@pytest.fixture(scope="module", params=["x", "\u6771"], ids=["ascii", "cjk"])
def long_line_corpus(request, tmp_path_factory):
  """(corpus, small corpus, where its long line starts and ends): a 100 MB line
  between documents, of ASCII or of CJK characters (three bytes each, none of
  which the search for a line's start recognises as text)."""
  directory = tmp_path_factory.mktemp("long_line")
  path = directory / "corpus.txt"
  with open(path, "wb") as f:
    f.write(HEAD)
    _write_long_line(f, request.param)
    end = f.tell()
    f.write(TAIL)
  small = directory / "small.txt"
  small.write_bytes(HEAD + b"short\n\nThree.\n")
  return path, small, len(HEAD), end


EXPECTED = {"sentences": [["One.", "Two."], ["Three."], ["Four."]],
            "documents": [["One."], ["Two."], ["Three."], ["Four."]]}


@pytest.mark.parametrize("file_format", ["sentences", "documents"])
@pytest.mark.parametrize("cut", ["none", "inside", "after", "both"])
def test_a_100_mb_corpus_line_is_skipped_in_bounded_memory(long_line_corpus, file_format, cut):
  """The data build's byte ranges may start inside the line (the search for the
  range's first line start reads past it) or just after it (the check that the
  line before is blank scans back over it); either way it is read a chunk at a
  time, counted once as skipped, and the other lines are read once."""
  path, small, start, end = long_line_corpus
  cuts = {"none": [], "inside": [(start + end) // 2], "after": [end + 1],
          "both": [start + 1, (start + end) // 2, end, end + 1, end + 3]}[cut]
  read = _peak_memory(_READ_CORPUS, small, path, file_format=file_format, cuts=cuts)
  result = read["result"]
  assert result["documents"] == EXPECTED[file_format]
  skipped = result["lines_skipped" if file_format == "sentences" else "documents_skipped"]
  assert skipped == {"over 100000 characters": 1}
  assert read["growth_mib"] < MEMORY_GROWTH_LIMIT_MIB, read["growth_mib"]


def test_a_100_mb_conll_line_is_skipped_in_bounded_memory(tmp_path):
  from bertjax.data import conll

  path = tmp_path / "eng.train"
  with open(path, "wb") as f:
    f.write(b"EU NNP I-NP I-ORG\n")
    _write_long_line(f, "x")
    f.write(b" NN I-NP O\nrejects VBZ I-VP O\n\nPeter NNP I-NP I-PER\n")
  small = tmp_path / "small.txt"
  small.write_text("EU NNP I-NP I-ORG\n\n")
  read = _peak_memory(_READ_CONLL, small, path)
  assert read["growth_mib"] < MEMORY_GROWTH_LIMIT_MIB, read["growth_mib"]
  assert read["result"] == {"words": [["EU", "rejects"], ["Peter"]],
                            "skipped": {f"a line over {conll.MAX_LINE_CHARS} characters": 1}}
