"""Checkpoint formats of other implementations: Hugging Face and Google TF."""
