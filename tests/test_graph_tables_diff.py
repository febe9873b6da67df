"""The graph tables kept by difference (lexgraph.query.graph_tables_diff) hold what a whole rewrite writes.

The sample corpus is ingested through Dagster with the lance backend forced (threshold 1); then a document is
added (naming entities other documents name), one changed and one removed, and ingested again. The tables the
diff left must equal, row for row once the row numbers are mapped to ids, the tables written whole from the same
lexical graph, and the channels on them must return the same evidence.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import dagster as dg
import numpy as np
import polars as pl
import pytest

from lexgraph.faults import CRASH_ENV, GRAPH_TABLES_DIFF
from lexgraph.index import LexIndex
from lexgraph.query import graph_tables_diff, graph_tables_step
from lexgraph.query import lance_graph_tables as gt
from lexgraph.query.retrieval import Retriever, load_lance_index
from lexgraph.settings import Settings
from lexgraph.storage.vector_store import VectorStore
from orchestration.runner import ingest_folder
from tests.conftest import cleared_variables, copy_corpus


def cleared_environment() -> dict[str, str]:
    cleared = set(cleared_variables())
    return {k: v for k, v in os.environ.items() if k not in cleared}

pytestmark = pytest.mark.ingest  # each case ingests the sample corpus through Dagster

ADDED = """# Kestrel and Halvorsen: joint engine review 2024

Annika Vogt of Kestrel Propulsion GmbH met the Halvorsen Maritime board in Aberdeen on 3 September 2024.
Kestrel Propulsion agreed to replace the fuel injectors on the Nordlys Spirit at its own cost.
Fathomline Services will monitor the engines through Tidewatch telemetry for twelve months.
The review found that the February 2024 engine fault was caused by a faulty injector batch from Kestrel.
"""


def _frame(store: VectorStore, name: str) -> pl.DataFrame:
    return pl.from_arrow(store.db.open_table(name).to_arrow()) if name in store.table_names() else pl.DataFrame()


def canonical(home) -> dict:
    """The graph tables with every row number replaced by the id it stands for, sorted: what must not depend on
    how the tables were written."""
    settings = Settings.from_env(home=home)
    store = VectorStore(settings.lance_uri)
    t = {name: _frame(store, name) for name in gt.GRAPH_TABLE_NAMES}
    entity = dict(zip(t[gt.GRAPH_ENTITIES]["row"], t[gt.GRAPH_ENTITIES]["entity_id"]))
    statement = dict(zip(t[gt.GRAPH_STATEMENTS]["row"], t[gt.GRAPH_STATEMENTS]["statement_id"]))
    node = dict(zip(t[gt.GRAPH_LINKS]["node"], t[gt.GRAPH_LINKS]["node_id"]))
    topic = dict(zip(t[gt.GRAPH_TOPICS]["topic_row"], t[gt.GRAPH_TOPICS]["topic_id"]))
    out = {
        "entities": sorted((r["entity_id"], r["name"], r["entity_type"], tuple(sorted(r["chunk_ids"])), r["chunk_count"],
                            tuple(sorted((entity[n], round(s, 9)) for n, s in zip(r["neighbours"], r["shares"]))),
                            tuple(np.round(np.asarray(r["vector"]), 5).tolist()))
                           for r in t[gt.GRAPH_ENTITIES].iter_rows(named=True)),
        "names": sorted({(r["key"], r["entity_id"], entity[r["row"]], r["kind"], r["rank"], r["doc_id"])
                         for r in t[gt.GRAPH_NAMES].iter_rows(named=True)}),
        "mentions": sorted((entity[r["entity_row"]], r["chunk_id"], r["doc_id"])
                           for r in t[gt.GRAPH_MENTIONS].iter_rows(named=True)),
        "relations": sorted((entity[r["a"]], entity[r["b"]], round(r["weight"], 9), r["doc_id"])
                            for r in t[gt.GRAPH_RELATIONS].iter_rows(named=True)),
        "statements": sorted((r["statement_id"], r["text"], r["topic"], topic[r["topic_row"]], r["chunk_id"],
                              r["doc_id"], tuple(sorted(node[n] for n in r["links"])),
                              tuple(np.round(np.asarray(r["vector"]), 5).tolist()))
                             for r in t[gt.GRAPH_STATEMENTS].iter_rows(named=True)),
        "topics": sorted((r["topic_id"], tuple(sorted(statement[s] for s in r["members"])), r["member_count"])
                         for r in t[gt.GRAPH_TOPICS].iter_rows(named=True)),
        "links": sorted((r["node_id"], tuple(sorted(statement[s] for s in r["members"])), r["member_count"],
                         r["chunk_count"]) for r in t[gt.GRAPH_LINKS].iter_rows(named=True)),
    }
    state = json.loads(LexIndex(settings).corpus_files.graph_tables.read_text())
    out["figures"] = {k: state[k] for k in ("chunks", "statements", "entity_df_min", "link_df_min", "bridge_pairs",
                                            "entity_mentions", "entity_relations", "entity_idf_max",
                                            "bridge_pair_share", "lexical_inputs")}
    return out


@pytest.fixture(scope="module", params=[gt.MEMBER_CAP, 3], ids=["cap", "hubs"])
def diffed(tmp_path_factory, request):
    """(home after add, change and remove by difference, the same lexical graph's tables written whole); with a
    member cap of 3 ("hubs"), most entities, nodes and topics are hubs, whose lists are not stored."""
    root = tmp_path_factory.mktemp("graph-diff")
    corpus, home = copy_corpus(root / "corpus"), root / "index"
    with pytest.MonkeyPatch.context() as patch, dg.DagsterInstance.ephemeral() as instance:
        patch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
        patch.setattr(gt, "MEMBER_CAP", request.param)
        first = ingest_folder(corpus, instance, home=str(home), progress=False)
        assert first.corpus_index_ok and not first.failed
        files = LexIndex(Settings.from_env(home=home)).corpus_files
        assert json.loads(files.graph_tables.read_text())["next"]["statement"] > 0
        shutil.copytree(home, root / "before")  # for the kill test: the index before the change
        (corpus / "kestrel-halvorsen-engine-review-2024.md").write_text(ADDED)
        changed = corpus / "email-nowak-engine-fault-2024-02.txt"
        changed.write_text(changed.read_text() + "\nPS: Annika Vogt at Kestrel Propulsion confirmed the injector batch.\n")
        (corpus / "hse-policy-summary.md").unlink()
        second = ingest_folder(corpus, instance, home=str(home), progress=False, prune=True)
        assert second.corpus_index_ok and not second.failed
        assert (second.new, second.changed, second.removed) == (1, 1, 1)
        event = instance.get_latest_materialization_event(dg.AssetKey("graph_tables"))
        metadata = event.asset_materialization.metadata
        assert metadata["decision"].value == "written by difference", metadata["why_whole"].value
        changes = json.loads(files.lexical_changes.read_text())
        assert changes["mode"] == "diff" and len(changes["documents"]) >= 3
        state = json.loads(files.graph_tables.read_text())
        assert state["lexical_inputs"] == changes["to"] and not state.get("writing")
        whole = root / "whole"
        shutil.copytree(home, whole)
        settings = Settings.from_env(home=whole)
        index = LexIndex(settings)
        patch.setattr(graph_tables_diff, "try_diff", lambda *a, **k: (None, "forced whole by the test"))
        outcome = graph_tables_step.update_graph_tables(index.corpus_files, index.vectors, index.extract_store, settings)
        assert outcome.figures["decision"] == "written whole"
    return home, whole, request.param


def test_tables_written_by_difference_equal_a_whole_rewrite(diffed):
    by_difference, whole = (canonical(home) for home in diffed[:2])
    assert by_difference["statements"] and by_difference["entities"] and by_difference["relations"]
    capped = [row for row in by_difference["links"] if row[2] > len(row[1])]
    assert bool(capped) == (diffed[2] == 3)  # the hubs case has hub nodes (the cap reached the Dagster runs)
    for part in by_difference:
        assert by_difference[part] == whole[part], part


def test_the_added_document_is_found_through_the_graph_channels(diffed, embedder):
    home, whole, _ = diffed
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
        ours, theirs = (Retriever(load_lance_index(Settings.from_env(home=h)), embedder.embed_query, None,
                                  embedder.embed_queries) for h in (home, whole))
        for method in ("statement", "entity", "path"):
            question = "Who replaced the fuel injectors on the Nordlys Spirit after the Kestrel review?"
            found = [h.doc_id for h in ours.search(method, question, 5)]
            assert any("engine-review" in d for d in found), (method, found)
            assert {h.chunk_id for h in ours.search(method, question, 10)} == \
                {h.chunk_id for h in theirs.search(method, question, 10)}, method


@pytest.mark.subprocess
def test_a_kill_during_the_diff_makes_the_next_run_write_the_tables_whole(diffed, tmp_path):
    """`kill -9` in the middle of the diff (statements written, entities not): the tables are marked as being
    written, so the next `lexgraph ingest` writes them whole, and they equal a whole rewrite."""
    home, whole, cap = diffed
    if cap != gt.MEMBER_CAP:
        pytest.skip("one kill is enough: the default member cap")
    crashed = tmp_path / "index"
    shutil.copytree(home.parent / "before", crashed)
    corpus = home.parent / "corpus"
    env = {**cleared_environment(), "LEXGRAPH_LANCE_THRESHOLD": "1"}
    command = [sys.executable, "-m", "orchestration.cli", "--home", str(crashed), "ingest", str(corpus), "--prune",
               "--quiet"]
    killed = subprocess.run(command, env={**env, CRASH_ENV: GRAPH_TABLES_DIFF}, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    state = json.loads(LexIndex(Settings.from_env(home=crashed)).corpus_files.graph_tables.read_text())
    assert state["writing"] and state["lexical_inputs"] is None
    again = subprocess.run(command, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    ours, theirs = canonical(crashed), canonical(whole)
    for part in ours:
        if part == "figures":
            ours[part].pop("lexical_inputs"), theirs[part].pop("lexical_inputs")  # the files' times differ
        assert ours[part] == theirs[part], part
