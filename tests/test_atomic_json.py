"""The one atomic JSON write, and the two caches that must survive a write that cannot happen."""
import json

import pytest

from lexgraph.atomic_json import write_json
from lexgraph.extract import onnx_export
from lexgraph.storage.extract_store import VERIFIED_FILE, ExtractStore


def test_a_failed_write_leaves_the_old_file_and_no_scratch(tmp_path):
    target = tmp_path / "deep" / "record.json"
    write_json(target, {"a": 1}, indent=1)  # the folder is made
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        write_json(target, {"a": object()})  # not serialisable: raised, nothing half-written
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in target.parent.iterdir()] == ["record.json"]


def test_cache_records_that_cannot_be_written_are_skipped_not_errors(tmp_path):
    store = ExtractStore(tmp_path / "extract")
    (store.root / VERIFIED_FILE).mkdir(parents=True)  # replacing a folder fails with OSError
    store.write_verified({"x": [1, 2]})
    assert store.read_verified() == {}
    model = tmp_path / "model.onnx"
    model.write_bytes(b"weights")
    (tmp_path / onnx_export.MEMO_FILE).mkdir()
    assert onnx_export._remembered_sha256s([model], tmp_path) == [onnx_export._sha256(model)]
    assert not list(tmp_path.glob(".*.tmp")) and not list((store.root).glob(".*.tmp"))
