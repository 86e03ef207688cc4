"""BERT in Flax Linen: config, encoder, heads and task models."""

from bertjax.models.bert import (TASK_MODELS, BertForMaskedLM, BertForMultipleChoice,
                                 BertForNextSentencePrediction, BertForPreTraining,
                                 BertForQuestionAnswering, BertForSequenceClassification,
                                 BertForTokenClassification, BertModel, abstract_params,
                                 build_model, example_inputs, init_params)
from bertjax.models.config import PRESETS, BertConfig
from bertjax.models.encoder import BertEncoder, EncoderOutput
from bertjax.models.layout import to_layout
