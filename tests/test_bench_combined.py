"""bench_combined's corpus prefix: every corpus's evidence ids name its own files in the combined folder, and two
corpora's same-named files stay two documents."""
import json
from pathlib import Path

import pytest

from benchmarks import bench_combined as bc
from lexgraph.evaluation import metrics as ev
from lexgraph.evaluation.corpus import PreparedCorpus, prepare_corpus
from lexgraph.ids import document_key
from lexgraph.inbox import iter_corpus_files

DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def _keys(folder: Path) -> set[str]:
    return {document_key(p.relative_to(folder).as_posix()) for p in iter_corpus_files(folder)}


def test_prefixed_evidence_names_its_own_corpus_files(tmp_path):
    parts = {}
    for name in ("lihua-world", "hotpotqa-passages"):
        folder = tmp_path / "src" / name
        (folder / "week1").mkdir(parents=True)
        (folder / "week1" / "20260121_1000.txt").write_text(f"{name} chat")
        (folder / "p00.txt").write_text(f"{name} passage")
        parts[name] = PreparedCorpus(folder, folder, "folder", name, tmp_path / name)
    combined = bc.materialise(parts, tmp_path / "cache")
    keys = _keys(combined.folder)
    assert len(keys) == 4  # the same file name in two corpora: two documents
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps({"0": {"question": "When?", "answer": "then", "type": "Single",
                                           "evidence": "Time: 20260121_10:00"}, "1": {"question": "None?",
                                           "answer": "Insufficient information.", "evidence": "N/A", "type": "Null"}}))
    mapped = bc.mapped_questions("lihua-world", questions, tmp_path / "mapped.json")
    assert mapped[0].evidence == ("lihua-world__20260121_1000",) and mapped[1].evidence == ()
    assert set(mapped[0].evidence) <= keys
    original = ev.load_questions(questions)
    assert [(q.qid, q.question, q.answer, q.qtype) for q in mapped] == [(q.qid, q.question, q.answer, q.qtype)
                                                                        for q in original]
    assert bc.materialise(parts, tmp_path / "cache").folder == combined.folder  # cached by the corpora's hashes


@pytest.mark.skipif(not DATASETS.is_dir(), reason=f"{DATASETS} not found (../shared)")
def test_every_dev_evidence_id_names_a_document(tmp_path):
    parts = {name: prepare_corpus(DATASETS / path, tmp_path) for name, (path, _, _) in bc.CORPORA.items()}
    keys = {bc.prefixed(name, k) for name, part in parts.items() for k in _keys(part.folder)}
    for name, (_, path, _) in bc.CORPORA.items():
        original = ev.load_questions(DATASETS / path)
        mapped = bc.mapped_questions(name, DATASETS / path, tmp_path / f"{name}.json")
        assert {e for q in mapped for e in q.evidence} <= keys
        assert [(q.qid, q.question, q.answer, q.qtype, q.aliases, len(q.evidence)) for q in mapped] == \
               [(q.qid, q.question, q.answer, q.qtype, q.aliases, len(q.evidence)) for q in original]
