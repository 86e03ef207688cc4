"""BERT in Flax Linen: config, encoder, heads and task models."""

from bertjax import lazy

# Imported when first used: `bertjax.models.config` (what the configs read)
# loads without Flax and JAX.
_API = {**{name: "bertjax.models.bert" for name in (
    "TASK_MODELS", "BertForMaskedLM", "BertForMultipleChoice", "BertForNextSentencePrediction",
    "BertForPreTraining", "BertForQuestionAnswering", "BertForSequenceClassification",
    "BertForTokenClassification", "BertModel", "abstract_params", "build_model",
    "example_inputs", "init_params")},
        "PRESETS": "bertjax.models.config", "EncoderConfig": "bertjax.models.config",
        "BertConfig": "bertjax.models.config",
        "BertEncoder": "bertjax.models.encoder", "EncoderOutput": "bertjax.models.encoder",
        "to_layout": "bertjax.models.layout"}
__all__ = sorted(_API)


__getattr__, __dir__ = lazy.api(__name__, _API)
