"""The embedder's onnx backends: the bundled model exported to ONNX once, offline, with its mean pooling
and normalisation inside the graph ("onnx", float32, its attention and embedding layers fused into
onnxruntime's own operators), and the traced graph int8 dynamically quantised ("onnx-int8"), both run by
onnxruntime and cached on disk.

An export is written to a temporary folder beside the cache entry and renamed into place, so a
killed export never leaves a half-written model that looks finished. Each entry has a manifest with
its model files' sha256; a damaged or unreadable entry is reported on stderr and exported again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np

from lexgraph.atomic_json import write_json

# Bump when the exported graph or the quantisation changes, so old cache entries are not reused.
EXPORT_RECIPE = "3"
FP32_FILE, INT8_FILE, MANIFEST = "model.onnx", "model_int8.onnx", "manifest.json"
TRACED_FILE = "traced.onnx"  # the export before fusion, quantised to INT8_FILE; not kept
MEMO_FILE = "sha256-memo.json"  # in the cache folder: size, time and sha256 of each file hashed before
MODEL_FILES = (FP32_FILE, INT8_FILE)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Agreement with the torch model that an export must reach on a probe sentence before it is kept.
MIN_PROBE_COSINE = 0.98
PROBE = "Li Hua met the Halvorsen Maritime Group's CEO in Oslo to discuss the autumn shipping contracts."


class OnnxExportError(RuntimeError):
    """The model cannot be exported to ONNX, or its export does not agree with the torch model."""


def default_cache_dir() -> Path:
    """Outside any index, so every index and test run of the machine shares one export."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "lexgraph" / "onnx"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _remembered_sha256s(paths: list[Path], memo_dir: Path) -> list[str]:
    """Each file's sha256, read again only when its size or modification time differ from those recorded in
    memo_dir's MEMO_FILE: hashing the model and its exports (200 MB) cost every process start a quarter of a
    second. A file rewritten in place gets a new time, so a torn or replaced file is still hashed again.
    The memo is read once and written once, when a file was hashed."""
    memo_path = memo_dir / MEMO_FILE
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    digests, hashed = [], False
    for path in paths:
        stat, key = path.stat(), str(path.resolve())
        seen = memo.get(key)
        if isinstance(seen, list) and seen[:2] == [stat.st_size, stat.st_mtime_ns]:
            digests.append(str(seen[2]))
            continue
        digests.append(_sha256(path))
        memo[key], hashed = [stat.st_size, stat.st_mtime_ns, digests[-1]], True
    if hashed:
        with contextlib.suppress(OSError):  # a cache of a cache: a read-only or full disk only costs the next start the hashing
            write_json(memo_path, memo)
    return digests


def cache_key(model_path: str | Path, cache_dir: str | Path | None = None) -> str:
    """The model's files, the recipe and the versions that shape the exported graph."""
    digest = hashlib.sha256(f"{EXPORT_RECIPE}|{version('torch')}|{version('onnxruntime')}".encode())
    folder, memo_dir = Path(model_path), Path(cache_dir or default_cache_dir())
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".txt", ".safetensors", ".bin"))
    for path, sha256 in zip(paths, _remembered_sha256s(paths, memo_dir)):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + sha256.encode())
    return digest.hexdigest()[:16]


def cache_entry(model_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / f"{Path(model_path).name}-{cache_key(model_path, cache_dir)}"


def cached_session(model_path: str | Path, quantised: bool, cache_dir: str | Path | None = None):
    """The session of a complete, intact cached export, or None (missing or damaged: load_session then
    exports it). Needs no model, so no torch: what a process with a warm cache loads."""
    entry = cache_entry(model_path, cache_dir)
    if check_entry(entry):
        return None
    return _session(entry / (INT8_FILE if quantised else FP32_FILE))


def load_session(model, model_path: str | Path, quantised: bool, cache_dir: str | Path | None = None):
    """An onnxruntime session of the model's export (int8 when quantised), exported first when the cache
    has none."""
    entry = cache_entry(model_path, cache_dir)
    problem = check_entry(entry)
    if problem == "missing":
        export_entry(model, entry)
    elif problem:
        print(f"lexgraph: the cached ONNX export {entry} is damaged ({problem}); exporting it again",
              file=sys.stderr)
        _discard(entry)
        export_entry(model, entry)
    return _session(entry / (INT8_FILE if quantised else FP32_FILE))


def check_entry(entry: Path) -> str:
    """'' when the entry is complete and intact, else what is wrong ('missing' when there is none)."""
    if not entry.exists():
        return "missing"
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        for name in MODEL_FILES:
            if not (entry / name).is_file():
                return f"{name} is missing"
        digests = _remembered_sha256s([entry / name for name in MODEL_FILES], entry.parent)
        for name, digest in zip(MODEL_FILES, digests):
            if digest != manifest["sha256"][name]:
                return f"{name} does not match the sha256 in {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{MANIFEST} unreadable: {error}"
    return ""


def export_entry(model, entry: Path) -> None:
    """Export, quantise, check against torch and rename into place; a concurrent exporter's entry wins."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        _export_fp32(model, work / TRACED_FILE)
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(work / TRACED_FILE), str(work / INT8_FILE), weight_type=QuantType.QInt8, per_channel=True)
        _fuse(work / TRACED_FILE, work / FP32_FILE, list(model)[0].auto_model.config)
        (work / TRACED_FILE).unlink()
        cosines = {name: _probe_cosine(model, _session(work / name)) for name in MODEL_FILES}
        for name, cosine in cosines.items():
            if cosine < MIN_PROBE_COSINE:
                raise OnnxExportError(f"the ONNX export {name} agrees with the torch model only to cosine "
                                      f"{cosine:.4f} (at least {MIN_PROBE_COSINE} required): is it a mean-pooled, "
                                      "normalised model?")
        manifest = {"sha256": {name: _sha256(work / name) for name in MODEL_FILES}, "recipe": EXPORT_RECIPE,
                    "probe_cosine": {name: round(c, 6) for name, c in cosines.items()},
                    "torch": version("torch"), "onnxruntime": version("onnxruntime")}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(work, entry)
        except OSError:
            if check_entry(entry):  # not a finished entry from another process: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _discard(entry: Path) -> None:
    """Move a damaged entry aside before deleting it, so no reader sees it half deleted."""
    aside = Path(tempfile.mkdtemp(prefix=f".{entry.name}.damaged.", dir=entry.parent))
    try:
        os.rename(entry, aside / "entry")
    except OSError:
        pass
    shutil.rmtree(aside, ignore_errors=True)


def _export_fp32(model, path: Path) -> None:
    import torch

    modules = list(model)
    pooling = getattr(modules[1], "pooling_mode", None) if len(modules) > 1 else None
    if pooling not in (None, "mean"):
        raise OnnxExportError(f"only mean-pooled models export to onnx-int8, this one pools by {pooling!r}")
    transformer = modules[0].auto_model
    wrapper = _mean_pooled_class()(transformer).eval()
    # Texts of two lengths, so the traced graph applies the attention mask to padding (a sample without
    # padding lets transformers skip the mask, and the trace would keep that shortcut).
    sample = model.tokenizer(["an example sentence", "a second, longer example sentence"], padding=True,
                             return_tensors="pt")
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    # Traced with the plain ("eager") attention: onnxruntime's optimizer recognises its pattern and fuses it
    # into one Attention operator, which it cannot do with the scaled-dot-product kernel torch uses by default.
    attention = transformer.config._attn_implementation
    transformer.set_attn_implementation("eager")
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer notes about constants that are constant for this model
            torch.onnx.export(wrapper, tuple(sample[name] for name in INPUTS), str(path), input_names=list(INPUTS),
                              output_names=["embedding"], dynamic_axes=axes | {"embedding": {0: "batch"}},
                              opset_version=17, dynamo=False)
    finally:
        transformer.set_attn_implementation(attention)  # the torch model embeds as before


def _fuse(traced: Path, path: Path, config) -> None:
    """The traced BERT graph with its attention, embedding, layer-norm and GELU subgraphs replaced by
    onnxruntime's fused operators (vectors equal to cosine 0.999999; 0.78-0.95x the time, docs/decisions/embedder.md).
    No approximation is switched on: GELU and the softmax stay exact."""
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(traced), model_type="bert", num_heads=config.num_attention_heads,
                           hidden_size=config.hidden_size, opt_level=1)
    fused.save_model_to_file(str(path))


def _mean_pooled_class():
    import torch

    class MeanPooled(torch.nn.Module):
        """The transformer, then the mean of its token vectors over the attention mask, normalised."""

        def __init__(self, transformer):
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids, attention_mask, token_type_ids):
            tokens = self.transformer(input_ids=input_ids, attention_mask=attention_mask,
                                      token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=1)

    return MeanPooled


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # After a run, idle intra-op threads would spin on a core before they sleep: with two embedding processes
    # on two cores (the tests' two workers, a multi-process executor) each spins on the core the other needs.
    # Stopping the spin after each run, not within one, keeps a query's latency (no spinning at all: 1.6x);
    # figures in docs/decisions/embedder.md.
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(session, features) -> np.ndarray:
    """Normalised vectors of one tokenised batch (numpy arrays as the tokenizer returns them)."""
    names = {i.name for i in session.get_inputs()}
    feeds = {name: np.asarray(features[name], dtype=np.int64) for name in INPUTS if name in names}
    if "token_type_ids" in names and "token_type_ids" not in features:
        feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
    return session.run(None, feeds)[0].astype(np.float32, copy=False)


def _probe_cosine(model, session) -> float:
    reference = model.encode([PROBE], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)[0]
    features = model.tokenizer([PROBE], return_tensors="np")
    return float(np.dot(reference, run_session(session, features)[0]))
