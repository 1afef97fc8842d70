"""Builders of small, real, local models for tests, benchmarks and ``--dev`` demos.

Tests must not depend on a model hub, so the real loading paths are exercised with models built
on the spot: a tiny BERT in Detoxify's checkpoint format (random or fixed-bias weights) plus
its config/tokenizer directory, and a spaCy pipeline with an entity_ruler for PERSON. They
load through exactly the same code as production models (``Detoxify(...)``, Presidio's
``NlpEngineProvider``); only their accuracy is meaningless.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ORIGINAL_CLASSES = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")
# Detoxify renames these on load (toxic -> toxicity, ...); what callers will see:
ORIGINAL_CATEGORIES = ("toxicity", "severe_toxicity", "obscene", "threat", "insult", "identity_attack")
_VOCAB = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "you", "are", "an", "idiot", "hello", "world", "nice",
          "day", "the", "a", "is", "what", "good", "bad", "i", "hate", "love", "this", "thank")


@dataclass(frozen=True)
class TinyDetoxify:
    checkpoint: str
    config_dir: str
    categories: tuple[str, ...]


def build_tiny_detoxify(
    directory: str | os.PathLike[str],
    *,
    classes: Sequence[str] = ORIGINAL_CLASSES,
    fixed_probabilities: Sequence[float] | None = None,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int | None = None,
) -> TinyDetoxify:
    """Write ``tiny.ckpt`` + ``hf/`` (config.json, vocab, tokenizer files) under ``directory``.

    With ``fixed_probabilities`` the classifier ignores the text (zero weights, bias =
    logit(p)), so tests can assert exact scores; otherwise weights are random (seeded).
    ``hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072`` is bert-base's shape
    (Detoxify's original); the default is a 2-layer BERT that loads in milliseconds.
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    root = Path(directory)
    hf = root / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "vocab.txt").write_text("\n".join(_VOCAB) + "\n")
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=len(_VOCAB), hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=intermediate_size or 2 * hidden_size, max_position_embeddings=128,
        num_labels=len(classes),
    )
    config.save_pretrained(hf)
    BertTokenizer(str(hf / "vocab.txt"), model_max_length=128).save_pretrained(hf)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    if fixed_probabilities is not None:
        if len(fixed_probabilities) != len(classes):
            raise ValueError("one probability per class")
        with torch.no_grad():
            model.classifier.weight.zero_()
            for i, p in enumerate(fixed_probabilities):
                p = min(max(p, 1e-6), 1 - 1e-6)
                model.classifier.bias[i] = math.log(p / (1 - p))
    checkpoint = {
        "config": {
            "arch": {"args": {"model_type": "bert-base-uncased", "model_name": "BertForSequenceClassification",
                              "tokenizer_name": "BertTokenizer", "num_classes": len(classes)}},
            "dataset": {"args": {"classes": list(classes)}},
        },
        "state_dict": model.state_dict(),
    }
    path = root / "tiny.ckpt"
    torch.save(checkpoint, path)
    rename = {"toxic": "toxicity", "identity_hate": "identity_attack", "severe_toxic": "severe_toxicity"}
    return TinyDetoxify(str(path), str(hf), tuple(rename.get(c, c) for c in classes))


def build_spacy_pipeline(
    directory: str | os.PathLike[str],
    *,
    persons: Sequence[str] = ("John Smith", "Maria Garcia", "Alice"),
    lang: str = "en",
) -> str:
    """A blank spaCy pipeline + entity_ruler tagging ``persons`` as PERSON, saved with ``to_disk``."""
    import spacy

    nlp = spacy.blank(lang)
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns(  # type: ignore[attr-defined]
        [{"label": "PERSON", "pattern": [{"LOWER": w.lower()} for w in name.split()]} for name in persons]
    )
    path = Path(directory)
    nlp.to_disk(path)
    return str(path)
