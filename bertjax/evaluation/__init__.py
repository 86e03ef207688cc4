"""Evaluation that matches the official tools: SQuAD, GLUE metrics, CoNLL NER."""
