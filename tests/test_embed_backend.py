"""LEXGRAPH_EMBED_BACKEND: torch, onnx and onnx-int8 give agreeing vectors, never mix in one index, both refuse
over-long chunks; the onnx export is cached on disk and re-exported when damaged; a big embedding call
inside a stage shows its batches."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from lexgraph import progress
from lexgraph.extract import onnx_export
from lexgraph.extract.embedder import Embedder, InputTooLongError, resolve_model_path
from lexgraph.ids import short_hash
from lexgraph.settings import CHUNKER_VERSION, Settings, SettingsError

SENTENCES = ["Li Hua bought flowers for Wolfgang's birthday.", "The bakery delivers bread every morning at seven.",
             "Quarterly revenue of the shipping group fell by four percent.", "Who runs Kestrel?"]


@pytest.fixture(scope="module")
def torch_embedder():
    return Embedder.shared(backend="torch")


@pytest.fixture(scope="module")
def onnx_embedder():
    return Embedder.shared(backend="onnx")


@pytest.fixture(scope="module")
def int8_embedder():
    return Embedder.shared(backend="onnx-int8")


def test_backend_setting_values_and_index_version():
    torch_settings = Settings.from_env({"LEXGRAPH_EMBED_BACKEND": "torch"})
    onnx_settings = Settings.from_env({"LEXGRAPH_EMBED_BACKEND": "onnx"})
    int8_settings = Settings.from_env({"LEXGRAPH_EMBED_BACKEND": " ONNX-INT8 "})
    assert (torch_settings.embed_backend, int8_settings.embed_backend) == ("torch", "onnx-int8")
    versions = {s.index_version for s in (torch_settings, onnx_settings, int8_settings)}
    assert len(versions) == 3
    assert torch_settings.index_dir != onnx_settings.index_dir
    # torch keeps the version indexes had before the backend was a setting: no backend in the hash
    assert torch_settings.index_version == "v" + short_hash(
        f"{CHUNKER_VERSION}|{torch_settings.embed_model}|{torch_settings.chunk_tokens}", 8)
    assert Settings.from_env({}).embed_backend == "onnx"
    with pytest.raises(SettingsError, match=r"^LEXGRAPH_EMBED_BACKEND must be one of torch, onnx, onnx-int8, got 'cuda'$"):
        Settings.from_env({"LEXGRAPH_EMBED_BACKEND": "cuda"})


@pytest.mark.subprocess
def test_bad_backend_exits_2_with_one_line(tmp_path):
    env = dict(os.environ, LEXGRAPH_EMBED_BACKEND="fp16", LEXGRAPH_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", "import sys; from orchestration.cli import main; sys.exit(main())",
                           "status"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "LEXGRAPH_EMBED_BACKEND" in lines[0] and "'fp16'" in lines[0]


@pytest.mark.parametrize("backend, least", [("onnx", 0.9999), ("onnx-int8", 0.99)])
def test_onnx_vectors_agree_with_torch(backend, least, torch_embedder, onnx_embedder, int8_embedder):
    other = {"onnx": onnx_embedder, "onnx-int8": int8_embedder}[backend]
    a, b = torch_embedder.embed(SENTENCES), other.embed(SENTENCES)
    assert a.shape == b.shape == (len(SENTENCES), 384)
    assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-4)
    assert (a * b).sum(axis=1).min() >= least
    # agreement is no accident: different sentences stay far apart
    assert float(a[0] @ b[1]) < 0.5


@pytest.mark.parametrize("backend", ["torch", "onnx", "onnx-int8"])
def test_over_long_chunks_refused_by_every_backend(backend, torch_embedder, onnx_embedder, int8_embedder):
    embedder = {"torch": torch_embedder, "onnx": onnx_embedder, "onnx-int8": int8_embedder}[backend]
    text = " ".join(["harbour"] * 300)
    assert embedder.count_tokens([text])[0] > embedder.max_tokens
    with pytest.raises(InputTooLongError, match="254-token input limit"):
        embedder.embed(["short one", text])
    assert embedder.embed_query(text).shape == (384,)  # queries are windowed, not refused


def test_unknown_backend_refused_by_the_embedder():
    with pytest.raises(ValueError, match="embedding backend must be one of torch, onnx, onnx-int8, got 'tpu'"):
        Embedder(backend="tpu")


@pytest.mark.slow  # two ONNX exports of the model
def test_damaged_cached_export_is_detected_and_rebuilt(torch_embedder, tmp_path, capfd):
    model_path = resolve_model_path(torch_embedder.model_name)
    onnx_export.load_session(torch_embedder.model, model_path, True, tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert onnx_export.check_entry(entry) == ""
    probes = json.loads((entry / "manifest.json").read_text())["probe_cosine"]
    assert probes["model.onnx"] >= 0.9999 and probes["model_int8.onnx"] >= 0.98
    # the float graph runs onnxruntime's fused attention (the faster graph), the int8 one is the traced graph's
    assert sorted(entry.iterdir()) == sorted(entry / name for name in [*onnx_export.MODEL_FILES, "manifest.json"])
    ops = {name: {node.op_type for node in onnx.load(entry / name).graph.node} for name in onnx_export.MODEL_FILES}
    assert {"Attention", "EmbedLayerNormalization"} <= ops["model.onnx"] and "Softmax" not in ops["model.onnx"]
    assert "Attention" not in ops["model_int8.onnx"]
    # the torch model still embeds with the attention it was loaded with, not the plain one used for the trace
    from sentence_transformers import SentenceTransformer

    loaded = SentenceTransformer(model_path, device="cpu")[0].auto_model.config._attn_implementation
    assert torch_embedder.model[0].auto_model.config._attn_implementation == loaded != "eager"

    model_file = entry / onnx_export.INT8_FILE
    model_file.write_bytes(model_file.read_bytes()[:1000])  # a torn write
    assert "model_int8.onnx does not match the sha256" in onnx_export.check_entry(entry)
    session = onnx_export.load_session(torch_embedder.model, model_path, False, tmp_path)
    assert f"the cached ONNX export {entry} is damaged" in capfd.readouterr().err
    assert onnx_export.check_entry(entry) == ""
    features = torch_embedder.model.tokenizer(SENTENCES[:1], return_tensors="np")
    reference = torch_embedder.embed(SENTENCES[:1])[0]
    assert float(onnx_export.run_session(session, features)[0] @ reference) >= 0.9999
    # no temporary folder is left behind (beside the entry, the memo of files hashed before)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([entry.name, onnx_export.MEMO_FILE])

    (entry / onnx_export.FP32_FILE).unlink()
    assert onnx_export.check_entry(entry) == "model.onnx is missing"
    (entry / "manifest.json").write_text("{not json")
    assert "manifest.json unreadable" in onnx_export.check_entry(entry)
    assert onnx_export.check_entry(tmp_path / "absent") == "missing"


class Recorder:
    def __init__(self):
        self.events = []

    def start(self, stage, total, unit):
        self.events.append(("start", stage, total, unit))

    def advance(self, stage, n):
        self.events.append(("advance", stage, n))


def test_big_embedding_inside_a_stage_shows_each_batch(onnx_embedder):
    texts = [f"statement number {i} about the harbour" for i in range(10)]
    previous = onnx_embedder.batch_size
    onnx_embedder.batch_size = 4
    try:
        with progress.reporting(Recorder()) as recorder:
            progress.start("lexical graph", 1, "build")
            onnx_embedder.embed(texts, long="pool")
            progress.advance("lexical graph", 1)
    finally:
        onnx_embedder.batch_size = previous
    assert recorder.events == [
        ("start", "lexical graph", 1, "build"),
        ("start", "lexical graph: embedding", 10, "texts"),
        ("advance", "lexical graph: embedding", 4), ("advance", "lexical graph: embedding", 4),
        ("advance", "lexical graph: embedding", 2),
        ("start", "lexical graph", 1, "build"),
        ("advance", "lexical graph", 1),
    ]


def test_chunk_embedding_with_a_callback_reports_only_to_it(onnx_embedder):
    seen = []
    with progress.reporting(Recorder()) as recorder:
        onnx_embedder.embed([f"chunk {i}" for i in range(70)], progress=seen.append)
    assert sum(seen) == 70 and recorder.events == []


def test_hashes_are_remembered_by_size_and_time_and_read_again_when_either_changes(tmp_path, monkeypatch):
    model_file = tmp_path / "model.onnx"
    model_file.write_bytes(b"weights" * 1000)
    hashed = []
    real = onnx_export._sha256
    monkeypatch.setattr(onnx_export, "_sha256", lambda path: hashed.append(path) or real(path))
    remembered = lambda path, memo_dir: onnx_export._remembered_sha256s([path], memo_dir)[0]  # noqa: E731
    first = remembered(model_file, tmp_path)
    assert remembered(model_file, tmp_path) == first and len(hashed) == 1  # from the memo
    model_file.write_bytes(b"weights" * 999)  # torn: another size
    assert remembered(model_file, tmp_path) == real(model_file) != first
    stat = model_file.stat()
    model_file.write_bytes(b"WEIGHTS" * 999)  # the same size, rewritten: another time
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert remembered(model_file, tmp_path) == real(model_file)
    assert len(hashed) == 3
    (tmp_path / onnx_export.MEMO_FILE).write_text("[torn")  # a damaged memo is hashing again, not an error
    assert remembered(model_file, tmp_path) == real(model_file)
