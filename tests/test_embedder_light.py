"""The light embedder: with a valid cached onnx export, only the tokenizers package's tokenizer and the
onnxruntime session are loaded (no torch, transformers or sentence-transformers), and everything it gives
equals what the sentence-transformers tokenizer gave: token ids, counts, offsets, padding, vectors."""
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lexgraph.extract import onnx_export
from lexgraph.extract.embedder import Embedder, ModelFilesError, resolve_model_path

HEAVY = ("torch", "transformers", "sentence_transformers")


@pytest.fixture(scope="module")
def texts(corpus_text) -> list[str]:
    """Varied text: accents (composed and decomposed), CJK, emojis, other scripts, control and zero-width
    characters, special-token look-alikes, an over-long word, empty and blank strings, very long text."""
    return ["", " ", "\n\t", "Who runs Kestrel?", "Crème brûlée à la façon de Zoë, Ångström, naïve café",
            "Cre\u0300me bru\u0302le\u0301e (decomposed accents)", "東京で会議がありました。北京和上海的合同。한국어 문장",
            "Shipping 🚢 delayed 😡👍🏽 — family: 👨‍👩‍👧‍👦, flags 🇳🇴🇬🇧", "Привет, мир! Γειά σου. مرحبا بالعالم. สวัสดีครับ",
            "zero\u200bwidth\u00a0nbsp\u0007bell\u0000nul\ufeffbom", "[CLS] the [SEP] tokens [PAD] [UNK] [MASK] in text",
            "x" * 150 + " supercalifragilisticexpialidocious", "MiXeD CaSe, numbers 1,234.56 and e-mail a.b@c.no",
            corpus_text, corpus_text[:3000]]


@pytest.fixture(scope="module")
def light():
    """Built with the shared default cache (exported first if this machine has none)."""
    Embedder.shared(backend="onnx")
    embedder = Embedder(backend="onnx")
    assert embedder._model is None  # the cache was valid: nothing of the full model was loaded
    return embedder


@pytest.fixture(scope="module")
def hf(light):
    """The transformers tokenizer the embedder used before (the sentence-transformers model's own)."""
    return light.model.tokenizer


class FullPath(Embedder):
    """The embedder as it was: the transformers tokenizer counts, cuts and feeds the same onnx session."""

    def count_tokens(self, texts):
        if not texts:
            return []
        encoded = self.model.tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def token_spans(self, text):
        encoded = self.model.tokenizer(text, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
        return [tuple(span) for span in encoded["offset_mapping"]]

    def features(self, batch):
        return self.model.tokenizer(batch, padding=True, truncation=True, max_length=self.max_seq_length,
                                    return_tensors="np")


@pytest.mark.subprocess
def test_light_path_imports_no_torch():
    Embedder.shared(backend="onnx"), Embedder.shared(backend="onnx-int8")  # both exports cached
    script = textwrap.dedent("""
        import sys
        from lexgraph.extract.embedder import Embedder
        for backend in ("onnx", "onnx-int8"):
            embedder = Embedder(backend=backend)
            embedder.embed(["Li Hua met the CEO.", "a second text"])
            embedder.embed_query(" ".join(["harbour"] * 600))
            assert embedder.count_tokens(["hello world"]) == [2] and embedder.dimension == 384
        print(sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_token_ids_counts_and_offsets_equal_the_transformers_tokenizer(light, hf, texts):
    expected = hf(texts, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
    encodings = light.tokenizer.encode_batch(texts, add_special_tokens=False)
    assert [e.ids for e in encodings] == expected["input_ids"]
    assert light.count_tokens(texts) == [len(ids) for ids in expected["input_ids"]]
    assert max(light.count_tokens(texts)) > 2000  # the long text is counted whole, never truncated
    for text, spans in zip(texts, expected["offset_mapping"]):
        assert light.token_spans(text) == [tuple(span) for span in spans]


def test_model_inputs_equal_the_transformers_tokenizer(light, hf, texts):
    for batch in (texts, texts[3:5], [texts[-2]], [""]):
        expected = hf(batch, padding=True, truncation=True, max_length=256, return_tensors="np")
        features = light.features(batch)
        assert features["input_ids"].shape[1] <= 256
        for name in ("input_ids", "token_type_ids", "attention_mask"):
            assert np.array_equal(features[name], expected[name]), name


def test_vectors_equal_the_full_path(light, texts, corpus_text):
    full = FullPath(backend="onnx")
    full.session = light.session  # the very same session: only the tokenizers differ
    chunks = [t for t in texts if light.count_tokens([t])[0] <= light.max_tokens]
    a, b = light.embed(chunks), full.embed(chunks)
    assert (a * b).sum(axis=1).min() >= 0.99999
    queries = [corpus_text[:5000], texts[7], "Who runs Kestrel?"]  # the first is windowed and pooled
    assert light._windows(queries[0]) == full._windows(queries[0])
    a, b = light.embed_queries(queries), full.embed_queries(queries)
    assert (a * b).sum(axis=1).min() >= 0.99999
    assert float(light.embed_query(queries[0]) @ full.embed_query(queries[0])) >= 0.99999
    assert (light.dimension, light.max_tokens, light.max_seq_length) == (full.dimension, 254, 256)


def test_missing_export_falls_back_to_the_full_model_and_exports(tmp_path, light):
    embedder = Embedder(backend="onnx", onnx_cache=tmp_path)
    assert embedder._model is not None  # the full model was loaded to export
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert entry.name == onnx_export.cache_entry(light.model_path).name
    assert onnx_export.check_entry(entry) == ""
    assert float(embedder.embed(["Who runs Kestrel?"])[0] @ light.embed(["Who runs Kestrel?"])[0]) >= 0.99999
    # with the entry now in place, the next embedder loads light
    assert Embedder(backend="onnx", onnx_cache=tmp_path)._model is None


def copy_model(tmp_path):
    target = tmp_path / "model copy"
    shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), target)
    return target


def assert_refused(folder, tmp_path, match: str) -> None:
    """The onnx embedder refuses the model folder with a ModelFilesError matching `match`."""
    with pytest.raises(ModelFilesError, match=match):
        Embedder(str(folder), backend="onnx", onnx_cache=tmp_path / "cache")


def test_damaged_tokenizer_file_is_named(tmp_path):
    folder = copy_model(tmp_path)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Wo')  # a torn write
    assert_refused(folder, tmp_path, r"model copy/tokenizer\.json: unreadable tokenizer")
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    assert_refused(folder, tmp_path, r"tokenizer\.json")
    assert not (tmp_path / "cache").exists()  # refused before any export was tried


def test_damaged_model_configuration_is_named(tmp_path):
    folder = copy_model(tmp_path)
    (folder / "config.json").write_text("{\"max_position")
    assert_refused(folder, tmp_path, r"model copy/config\.json: unreadable model configuration")


def test_folder_without_tokenizer_file_uses_the_transformers_tokenizer(tmp_path, light, texts):
    folder = copy_model(tmp_path)
    (folder / "tokenizer.json").unlink()  # transformers builds the tokenizer from vocab.txt
    embedder = Embedder(str(folder), backend="torch")
    assert embedder.count_tokens(texts) == light.count_tokens(texts)
    assert embedder.token_spans(texts[6]) == light.token_spans(texts[6])
    for name, array in embedder.features(texts[3:8]).items():
        assert np.array_equal(array, light.features(texts[3:8])[name]), name


def test_damaged_tokenizer_configuration_and_an_unknown_padding_token_are_named(tmp_path):
    folder = copy_model(tmp_path)
    (folder / "tokenizer_config.json").write_text('{"pad_token": ')  # a torn write
    assert_refused(folder, tmp_path, r"model copy/tokenizer_config\.json: unreadable tokenizer configuration")
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": "[NOT-IN-VOCAB]"}))
    assert_refused(folder, tmp_path, r"the padding token '\[NOT-IN-VOCAB\]' is not in the tokenizer's vocabulary")


def test_a_damaged_model_file_is_named_in_every_documents_failure(tmp_path, monkeypatch, instance):
    """The ingest report names the file, not only the parser's complaint about a line of it."""
    from orchestration.runner import ingest_folder

    folder = copy_model(tmp_path)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Wo\n')  # a torn write
    monkeypatch.setenv("LEXGRAPH_EMBED_MODEL", str(folder))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in ("a.md", "b.md"):
        (inbox / name).write_text(f"# {name}\n\nKestrel Propulsion supplies the engines.\n")
    report = ingest_folder(inbox, instance, home=str(tmp_path / "home"), progress=False)
    assert len(report.failed) == 2 and report.new == 2
    for message in report.failed.values():
        assert "document_chunks: ModelFilesError: " in message and "model copy/tokenizer.json: unreadable tokenizer" in message
