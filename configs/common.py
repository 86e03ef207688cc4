"""Blocks shared by the configs: model sizes, the logical-axis rules, defaults.

Model code names only logical axes; `LOGICAL_AXIS_RULES` maps them onto the
mesh axes `data` (batch replicas), `fsdp` (batch and parameter shards) and
`tensor` (heads and feed-forward shards). An axis mapped to None is replicated;
a mesh axis already used by another dimension of the same array is skipped.
"""

import ml_collections

from bertjax import errors
from bertjax.models.config import PRESETS

LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    # The word embedding table's rows. Padded to a multiple of 128
    # (`model.vocab_pad_multiple`) they divide over "tensor" too, if mapped there
    # (the masked LM's bias, `vocab_size` long, stays replicated).
    ("vocab", None),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
)


def model_config(size: str, **overrides) -> ml_collections.ConfigDict:
  """The `EncoderConfig` fields of a named size (`bertjax.models.PRESETS`) as a ConfigDict.

  Sizes: bert_base, bert_large, bert_L{2..12}_H{128,256,512,768} (and bert_tiny,
  bert_mini, bert_small, bert_medium), table6_L*_H*_A* (the paper's Table 6).
  """
  if size not in PRESETS:
    raise errors.UsageError(f"Unknown model size {size!r}; known: {', '.join(sorted(PRESETS))}")
  # "gelu_tanh": the original modeling.py's gelu (what Google's checkpoints ran).
  # Attention dropout 0 (the paper: 0.1) lets "auto" run the fused attention
  # kernels, which have none. On the demo with hidden dropout 0.1, leaving it
  # out moved the held-out figures by less than the evaluation's noise
  # (docs/benchmarks.md#attention-dropout-on-the-demo). 0.1 is the paper's
  # exact recipe; "auto" then runs XLA's attention.
  # vocab_pad_multiple: the word table padded to whole tiles (30,592 rows for
  # 30,522 words); the padding rows are never predicted nor exported.
  # residual_dtype "": the stream between layers in `dtype` ("float32" keeps
  # it there, as PyTorch's autocast does, at twice its memory).
  fields = dict(vocab_size=30522, vocab_pad_multiple=128, hidden_act="gelu_tanh",
                max_position_embeddings=512,
                type_vocab_size=2, hidden_dropout_prob=0.1, attention_dropout_prob=0.0,
                dtype="bfloat16", residual_dtype="", scan_layers=True,
                remat_policy="none", attention_impl="auto")
  return ml_collections.ConfigDict({**fields, **PRESETS[size], **overrides})


def parse_arg(arg: str | None) -> dict[str, str]:
  """Config arguments: `name` or `name=value`, comma-separated (`no_nsp,size=bert_L4_H256`)."""
  options = {}
  for part in (arg or "").split(","):
    if part.strip():
      name, _, value = part.partition("=")
      options[name.strip()] = value.strip() or "true"
  return options


def choose(arg: str | None, choices, config_file: str, what: str) -> str:
  """The config argument, which must be one of `choices` (a clear error otherwise)."""
  if arg not in choices:
    raise errors.UsageError(f"{config_file} needs {what} as its argument, one of "
                            f"{', '.join(choices)} (--config={config_file}:{next(iter(choices))})")
  return arg


def pretrain_config(size: str = "bert_base") -> ml_collections.ConfigDict:
  """The paper's pre-training recipe (section A.2) for a model size."""
  config = ml_collections.ConfigDict()
  config.task = "pretrain"  # which job bertjax.main runs
  config.seed = 0  # the initialisation, the data order and the masks
  # "mlm_nsp" (the paper), "mlm_pairs" (No NSP), "mlm" (No NSP, packed text),
  # "ltr" (LTR & No NSP).
  config.objective = "mlm_nsp"
  config.model = model_config(size)

  config.data = ml_collections.ConfigDict()
  config.data.dir = ""            # prepared by bertjax.tools.prepare_pretraining_data
  config.data.build_from = ""     # if set and `dir` is empty: build <workdir>/data from it
  config.data.vocab_size = 30522  # of the vocabulary trained for `build_from`
  config.data.tokenizer = "wordpiece"  # what it trains for `build_from`: or "bpe" (byte-level)
  # How `build_from` is read: "sentences" (one a line, a blank line between
  # documents) or "documents" (one a line, split into sentences); "": sentences,
  # refusing a file that looks like one document a line.
  config.data.file_format = ""
  config.data.masked_lm_prob = 0.15  # the share of tokens predicted
  # Of the predicted tokens: replaced by [MASK], by a random token; the rest
  # stay (80/10/10, the paper's Table 8 varies them).
  config.data.mask_rate = 0.8
  config.data.random_rate = 0.1  # (the rest of the predicted tokens stay as they are)
  config.data.whole_word_masking = False  # mask a word's pieces together
  # "original": as create_pretraining_data.py, only [CLS] and [SEP] are never
  # masked and random tokens come from the whole vocabulary; "excluded": no
  # special token ([UNK], [MASK], [PAD] too) is masked or drawn.
  config.data.masking_specials = "original"
  # "bert": that share of each sequence exactly, [CLS] and [SEP] never;
  # "modernbert": each token independently at the rate, specials included
  # (max_predictions then needs room above the mean: bertjax.data.masking).
  config.data.masking = "bert"
  config.data.short_seq_prob = 0.1  # sequences made shorter at random, as the original
  # mlm: a document gives one sequence, its first tokens, the rest left out
  # (ModernBERT's rule); false: long documents go on in further sequences.
  config.data.truncate_documents = False
  # Instances shuffled together: a 50,000 window makes a batch of 256 nearly as
  # mixed as a full shuffle at ~11 instances a document, for tens of MiB a
  # loader process (benchmarks/shuffle_mixing.py,
  # docs/benchmarks.md#shuffle-window-and-batch-independence); a start or
  # restore makes a window's instances first.
  config.data.shuffle_window = 50_000
  # Loader processes a host runs; -1 sizes them for the devices (0 on CPUs:
  # bertjax.throughput.loader_workers); a run that waits for data says so.
  config.data.worker_count = -1
  # Data on gs://: "stream" (each document a ranged read, nothing copied to
  # the host), "copy" (each host copies the shards into BERTJAX_CACHE_DIR
  # first), or "auto": this host's complete copy if it has one, else stream
  # (docs/storage.md). A local path (a mounted bucket) is read in place.
  config.data.read_mode = "auto"
  # Documents read ahead of the loader, by half as many threads; -1: 64 for
  # gs:// data, 0 for a local directory (give a mounted bucket 64).
  config.data.read_ahead = -1
  # Rows of up to this many sequences that do not attend to each other
  # (bertjax.data.packing): no compute on padding. 1: one sequence a row, as
  # the paper. Packed, train.batch_size counts rows (the log's sequences/s
  # says how many sequences they hold).
  config.data.max_sequences_per_row = 1
  config.data.packing_window = 2000  # sequences packed together
  config.data.eval_percent = 1.0  # documents held out for evaluation
  config.data.host_sharding = "documents"  # or "rows": batches independent of host count
  # The original's regime: mask once, into `static_dupe_factor` copies of the
  # training documents' instances, written beside the documents for each
  # phase's length before the run (and reused after); evaluation masks anew.
  config.data.static = False
  config.data.static_dupe_factor = 10  # copies, each masked its own way

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 256           # sequences per step, all hosts together
  config.train.accumulation_steps = 1     # micro-batches per step
  config.train.total_steps = 1_000_000   # optimizer steps, both phases
  config.train.max_seq_length = 128       # "90% of the steps"
  config.train.max_predictions = 20      # masked positions a row predicts at most
  config.train.long_from_step = 900_000   # then 512 "for the remaining 10%"
  config.train.long_seq_length = 512     # the long phase's sequence length
  config.train.long_max_predictions = 80  # the long phase's
  config.train.long_batch_size = -1       # sequences a step from long_from_step; -1: batch_size
  # Batch-size warmup (ModernBERT's): the first phase's batch grows from
  # batch_ramp_start in steps of it over batch_ramp_steps steps, each size for
  # an equal run of steps, then is batch_size (0: the full batch from the start).
  config.train.batch_ramp_start = 0
  config.train.batch_ramp_steps = 0  # the warmup's steps (0: none)
  # Model fields the long phase changes (ModernBERT: its global rotary base);
  # none that changes a parameter's shape.
  config.train.long_model = ml_collections.ConfigDict()

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "adamw"         # or "lamb", "stableadamw"
  config.optimizer.learning_rate = 1e-4   # the peak
  config.optimizer.warmup_steps = 10_000  # linear, from 0 to the peak
  # "linear": the paper's (warmup, then a straight line to 0 at the end);
  # "wsd": warmup, stable, then `decay_shape` over the last `decay_steps`
  # to `final_fraction` of the plateau, which is `long_learning_rate` from
  # train.long_from_step on (-1: learning_rate).
  config.optimizer.schedule = "linear"
  config.optimizer.decay_steps = 0         # wsd: the decay's steps, at the end
  config.optimizer.decay_shape = "1-sqrt"  # wsd: or "linear"
  config.optimizer.final_fraction = 0.0    # wsd: of the plateau, at the end
  config.optimizer.long_learning_rate = -1.0  # wsd: the long phase's plateau (-1: the peak)
  # Restarts of the wsd plateau, ModernBERT's `restart_override`: a tuple of
  # (step, learning_rate, weight_decay), each from its step on; the moments
  # go on, and stableadamw's decay stays measured against learning_rate.
  config.optimizer.restarts = ()
  config.optimizer.weight_decay = 0.01    # not on LayerNorm and biases
  config.optimizer.b1 = 0.9               # Adam's first moment's decay
  config.optimizer.b2 = 0.999             # Adam's second moment's decay
  config.optimizer.eps = 1e-6             # Adam's epsilon
  config.optimizer.max_grad_norm = 1.0    # global-norm clipping (0: none)
  # The original's AdamWeightDecayOptimizer has no bias correction (optim.py).
  config.optimizer.bias_correction = False

  # The device mesh's axes (-1: the devices left); docs/configs.md#the-mesh.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  config.logical_axis_rules = LOGICAL_AXIS_RULES  # logical axes -> mesh axes

  # Saves every `every_steps` steps and every `every_seconds` of wall clock
  # (0: by steps only), whichever comes first: a preemption loses at most
  # every_seconds plus one save's time (docs/checkpoints.md).
  config.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=10_000,  # a save every this many steps
      every_seconds=600,  # and every this many seconds of wall clock (0: by steps only)
      max_to_keep=3,  # the newest saves kept
      async_save=True))  # written while the next steps train
  config.eval = ml_collections.ConfigDict(dict(
      every_steps=10_000,  # a held-out evaluation every this many steps, and at the last
      batches=50,  # held-out batches an evaluation reads
      batch_size=256,  # sequences a held-out batch
      masked_lm_prob=-1.0))  # the held-out documents' masking rate (-1: data.masked_lm_prob)
  config.log_every_steps = 100  # a progress line every this many steps
  # What a chip-hour costs you (on-demand, spot or committed, in your
  # currency; a device is a chip from TPU v4 on): above 0, each progress line
  # says what the rest of the run costs at its measured speed.
  config.price_per_chip_hour = 0.0
  config.max_consecutive_skips = 10  # non-finite steps in a row before the run stops
  config.divergence = divergence_config()
  # Capture a profiler trace (<workdir>/profile) for num_steps from start_step.
  config.profile = ml_collections.ConfigDict(dict(start_step=-1, num_steps=5))
  config.wandb = wandb_config()
  return locked(config)


def apply_options(config: ml_collections.ConfigDict, options: dict[str, str]) -> None:
  """The ablations and variants every pre-training config accepts.

  - `no_nsp`: the paper's "No NSP" as it reads: the next-sentence pairs
    (half with a random second segment), the masked LM alone;
  - `no_nsp_packed`: "No NSP" on contiguous text packed to the length, with no
    random segments (RoBERTa's FULL-SENTENCES);
  - `ltr`: "LTR & No NSP" (a left-to-right LM, causal attention, on the No
    NSP pairs with both segment embeddings: the paper's input representation);
  - `static`: the original's static masking (`data.static`): each phase's
    instances masked once, 10 copies;
  - `packed`: rows of up to 3 sequences that do not attend to each other
    (`data.max_sequences_per_row`): no compute on padding;
  - `lamb`: large-batch LAMB: 32k sequences a step for the same 256M sequences
    as the paper's recipe (a starting point; tune steps and learning rate);
  - `size=<preset>`: another model size (Table 6 grid, small BERTs).
  """
  known = {"no_nsp", "no_nsp_packed", "ltr", "lamb", "size", "static", "packed"}
  unknown = sorted(set(options) - known)
  if unknown:
    raise errors.UsageError(f"unknown config arguments {unknown}; known: {sorted(known)}")
  ablations = sorted({"no_nsp", "no_nsp_packed", "ltr"} & set(options))
  if len(ablations) > 1:
    raise errors.UsageError(f"choose one of the ablations {ablations}")
  if "size" in options:
    if options["size"] not in PRESETS:
      raise errors.UsageError(f"Unknown model size {options['size']!r}; known: "
                              f"{', '.join(sorted(PRESETS))}")
    with config.unlocked():  # another family's preset brings its own fields
      config.model.update(PRESETS[options["size"]])  # layers and widths only
  if "no_nsp" in options:
    config.objective = "mlm_pairs"
  if "no_nsp_packed" in options:
    config.objective = "mlm"
  if "ltr" in options:
    config.objective = "ltr"
  if "static" in options:
    config.data.static = True
  if "packed" in options:
    config.data.max_sequences_per_row = 3
  if "lamb" in options:
    config.optimizer.name = "lamb"
    config.optimizer.bias_correction = True  # LAMB's paper and NVIDIA's code correct
    config.train.batch_size = 32768
    config.train.total_steps = 7_813     # the same 256M sequences as 256 x 1M
    config.train.long_from_step = 7_031  # 90%
    config.optimizer.learning_rate = 4e-3
    config.optimizer.warmup_steps = 1_563  # 20%
    config.checkpoint.every_steps = 500
    config.eval.every_steps = 500
    config.log_every_steps = 10


def finetune_config(task: str) -> ml_collections.ConfigDict:
  """The paper's fine-tuning protocol (section 4 and A.3), shared by the tasks.

  Batch 32, 3 epochs, Adam with learning rate from {5e-5, 4e-5, 3e-5, 2e-5}
  (`bertjax.tools.sweep` tries them), 10% warmup then linear decay, weight decay
  0.01, dropout 0.1 on every layer and on the attention probabilities whatever
  the checkpoint was pre-trained with (bertjax's pre-training leaves attention
  dropout out for the fused kernels); Adam without bias correction, as the
  original code's optimizer.
  """
  config = ml_collections.ConfigDict()
  config.task = task  # which job bertjax.main runs
  config.seed = 0  # the new output layer's initialisation and the data order
  # A bertjax pre-training workdir or model directory, a Hugging Face directory
  # or a Google TF checkpoint directory.
  config.init_checkpoint = ""
  config.max_seq_length = 128  # tokens an example is cut or padded to

  config.data = ml_collections.ConfigDict()
  config.data.source = "tsv"  # the official files in `dir`, or "tfds" (`dir`: TFDS data_dir)
  config.data.dir = ""  # the task's files

  config.model = ml_collections.ConfigDict()
  config.model.dtype = "bfloat16"           # computation; parameters stay float32
  config.model.residual_dtype = ""          # the stream between layers: "" is dtype
  # The paper's fine-tuning dropout (A.3; run_classifier.py's bert_config).
  # Attention dropout runs on XLA's attention. Negative: the checkpoint's own.
  config.model.hidden_dropout_prob = 0.1
  config.model.attention_dropout_prob = 0.1

  config.train = ml_collections.ConfigDict()
  config.train.learning_rate = 2e-5       # the peak (the paper sweeps 5e-5 to 2e-5)
  config.train.batch_size = 32            # examples a step
  config.train.epochs = 3.0               # passes over the training set
  config.train.warmup_proportion = 0.1    # of the steps, linear from 0; then to 0 at the end
  config.train.weight_decay = 0.01        # decoupled, not on LayerNorm and biases
  config.train.eps = 1e-6                 # Adam's epsilon
  config.train.max_grad_norm = 1.0        # global-norm clipping
  config.train.bias_correction = False  # as run_classifier.py's optimizer (optim.py)
  config.train.eval_batch_size = 64       # examples a dev or test batch

  # The device mesh's axes (-1: the devices left); docs/configs.md#the-mesh.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  config.logical_axis_rules = LOGICAL_AXIS_RULES  # logical axes -> mesh axes
  config.log_every_steps = 50  # a progress line every this many steps
  config.max_consecutive_skips = 10  # non-finite steps in a row before the run stops
  config.divergence = divergence_config()
  config.wandb = wandb_config()
  return config  # each task's config file adds its fields, then returns it `locked`


def locked(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with its set of fields fixed: a misspelt field set in a config
  file (`config.train.learning_rte = ...`) is an error naming the line and the
  field meant, not a new field nothing reads. (`train.long_model` takes any
  model field; `with config.unlocked():` adds fields of your own.)"""
  config.lock()
  if "long_model" in config.train:
    config.train.long_model.unlock()
  return config


def divergence_config() -> ml_collections.ConfigDict:
  """When a finite loss counts as diverged (`bertjax.divergence`): above `factor`
  x the median of the last `window` steps' losses is out of range, and no
  checkpoint is saved while the last loss is (0: off). `steps` such steps in a
  row either moved to a new level, which re-bases the range, or stop the run."""
  # A new level (a shift, re-based on): every loss of those steps at most
  # `max_shift` x the median (0: never re-base), the median of their later
  # half at most `max_rise` x that of the earlier (not still rising), and
  # their gradient norms finite and at most `max_grad_ratio` x the median
  # norm of the range.
  return ml_collections.ConfigDict(dict(
      factor=3.0,  # a loss above this x the recent median is out of range (0: off)
      steps=20,  # out-of-range steps in a row before the guard decides
      window=100,  # the recent losses the median is taken over
      max_shift=10.0,  # a new level: every loss at most this x the median
      max_rise=1.2,  # a new level: its later half's median at most this x the earlier's
      max_grad_ratio=10.0))  # a new level: gradient norms at most this x the median norm


def wandb_config() -> ml_collections.ConfigDict:
  """Weights & Biases (`bertjax.trackers`, the `[wandb]` extra): off until
  `project` is set; then process 0 sends every metric the run writes and the
  config, and a resumed pre-training run goes on as the same W&B run."""
  return ml_collections.ConfigDict(dict(
      project="",  # the W&B project the run goes to ("": no W&B)
      entity="",  # the W&B team or user ("": your default entity)
      name="",  # the run's display name ("": W&B names it)
      group="",  # the W&B group the run joins ("": none)
      tags=(),  # W&B tags, a tuple of strings
      notes="",  # the run's description in W&B
      # "online"; "offline": written locally only, for `wandb sync` later;
      # "disabled": no W&B at all.
      mode="online",
      dir=""))  # where W&B keeps its local files ("": the workdir; a gs:// workdir: W&B's own)
