"""The search_indexes corpus step is tracked like the others: recorded when built, out of step when its
settings change or a crash stops it before its record, and then run alone (not the whole corpus job)."""
import dagster as dg

from lexgraph.indexing.corpus_state import (CORPUS_STEPS, GRAPH_TABLES, SEARCH_INDEXES, CorpusFiles, catalog_digest,
                                            solo_steps)
from lexgraph.settings import Settings
from lexgraph.storage import lance_indexes
from orchestration.runner import ingest_folder
from tests.helpers import stores


def _steps_run(instance, run_id):
    return sorted(s.step_key for s in instance.get_run_step_stats(run_id))


def _ingest(corpus, instance, home):
    report = ingest_folder(corpus, instance, home=str(home), progress=False)
    assert report.corpus_index_ok is not False, report.corpus_error
    return report


def test_solo_steps_only_for_steps_nothing_reads():
    assert solo_steps([]) is None
    assert solo_steps(["search_indexes"]) == ["search_indexes"]
    assert solo_steps(["search_indexes", "lexical_graph"]) == ["search_indexes", "lexical_graph"]
    assert solo_steps(["keyword_index", "search_indexes"]) is None


def test_search_indexes_recorded_rerun_alone_on_a_setting_change_and_after_a_crash(tiny_corpus, home, instance,
                                                                                   monkeypatch):
    _ingest(tiny_corpus, instance, home)
    settings = Settings.from_env(home=home)
    files = CorpusFiles(settings.index_dir)
    catalog = stores(home)[0].indexed_hashes()
    assert SEARCH_INDEXES in CORPUS_STEPS
    assert files.built_digests()[SEARCH_INDEXES] == catalog_digest(catalog)
    assert files.stale_steps(catalog, settings) == []
    assert not lance_indexes.state_path(files.root).exists()  # below the threshold: nothing built

    # a lower threshold: only the steps the search settings shape (search_indexes and the lexical graph's tables)
    # are out of step, and only they run
    monkeypatch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
    lowered = Settings.from_env(home=home)
    assert files.stale_steps(catalog, lowered) == [SEARCH_INDEXES, GRAPH_TABLES]
    report = _ingest(tiny_corpus, instance, home)
    assert report.corpus_run is not None and _steps_run(instance, report.corpus_run) == [GRAPH_TABLES, SEARCH_INDEXES]
    assert lance_indexes.state_path(files.root).exists() and files.graph_tables.exists()
    assert files.stale_steps(catalog, lowered) == []
    assert _ingest(tiny_corpus, instance, home).corpus_run is None  # current: nothing runs

    # killed before its record (simulated by losing the record): out of step, rerun alone, recorded again
    built = files._read_built()
    del built[SEARCH_INDEXES]
    files._write_built(built)
    assert files.stale_steps(catalog, lowered) == [SEARCH_INDEXES]
    report = _ingest(tiny_corpus, instance, home)
    assert _steps_run(instance, report.corpus_run) == [SEARCH_INDEXES]
    assert files.stale_steps(catalog, lowered) == []


def test_a_failing_search_step_stays_out_of_step_and_names_the_problem(tiny_corpus, home, instance, monkeypatch):
    _ingest(tiny_corpus, instance, home)
    monkeypatch.setenv("LEXGRAPH_QUERY_BACKEND", "lance")
    files = CorpusFiles(Settings.from_env(home=home).index_dir)
    state = lance_indexes.state_path(files.root)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.mkdir()  # a folder where its state file goes: the step cannot write it
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert report.corpus_index_ok is False and "search_indexes" in (report.corpus_error or "")
    catalog = stores(home)[0].indexed_hashes()
    assert SEARCH_INDEXES in files.stale_steps(catalog, Settings.from_env(home=home))
    state.rmdir()
    report = _ingest(tiny_corpus, instance, home)
    assert SEARCH_INDEXES in _steps_run(instance, report.corpus_run)
    assert files.stale_steps(catalog, Settings.from_env(home=home)) == []
    latest = instance.fetch_materializations(dg.AssetKey(SEARCH_INDEXES), limit=1).records[0]
    assert latest.asset_materialization.metadata["decision"].value != "below threshold: none"


def test_a_corpus_update_leaves_the_indexed_chunk_rows_indexed(tiny_corpus, home, instance, monkeypatch):
    """PageRank and the skeleton go to their own table: a new β rewrites no chunk row, so LanceDB's indexes
    stay whole (no re-index of the chunk table per update)."""
    monkeypatch.setenv("LEXGRAPH_QUERY_BACKEND", "lance")
    _ingest(tiny_corpus, instance, home)
    vectors = stores(home)[0]
    assert lance_indexes.chunk_index_states(vectors)[lance_indexes.ANN_INDEX].present
    monkeypatch.setenv("LEXGRAPH_BETA", "0.5")
    report = _ingest(tiny_corpus, instance, home)
    assert "skeleton_selection" in _steps_run(instance, report.corpus_run)
    latest = instance.fetch_materializations(dg.AssetKey(SEARCH_INDEXES), limit=1).records[0]
    metadata = latest.asset_materialization.metadata
    assert metadata["decision"].value == "current" and metadata["unindexed_rows"].value == 0
    scores = vectors.db.open_table("chunk_scores").to_arrow()
    assert scores.num_rows == vectors.count("chunks") and sum(scores.column("in_skeleton").to_pylist()) == \
        int(0.5 * scores.num_rows)


def test_chunk_rows_of_the_former_layout_lose_their_score_columns_and_keep_their_indexes(tiny_corpus, home,
                                                                                       instance, monkeypatch):
    monkeypatch.setenv("LEXGRAPH_QUERY_BACKEND", "lance")
    _ingest(tiny_corpus, instance, home)
    vectors = stores(home)[0]
    vectors.db.open_table("chunks").add_columns({"pagerank": "CAST(0.0 AS DOUBLE)", "in_skeleton": "false"})
    (tiny_corpus / "delta.md").write_text("# Delta\n\nDelta Tankers chartered the vessel Nordlys Spirit.\n")
    _ingest(tiny_corpus, instance, home)
    table = vectors.db.open_table("chunks")
    assert "pagerank" not in table.schema.names and "in_skeleton" not in table.schema.names
    assert all(s.present for s in lance_indexes.chunk_index_states(vectors).values())
    assert "delta.md" in " ".join(vectors.sources()["relative_path"].to_list())


def test_the_corpus_sensor_runs_the_search_steps_alone_once_per_setting(tiny_corpus, home, instance):
    from orchestration.definitions import build_definitions
    from orchestration.sensors import corpus_index_sensor

    def tick(settings):
        defs = build_definitions(settings)
        with dg.build_sensor_context(instance=instance, resources=defs.resources,
                                     repository_def=defs.get_repository_def()) as context:
            return corpus_index_sensor.evaluate_tick(context)

    _ingest(tiny_corpus, instance, home)
    settings = Settings.from_env(home=home, inbox=tiny_corpus)
    assert tick(settings).skip_message.startswith("corpus index is current")
    requests = {}
    for threshold in (1, 2):
        [request] = tick(settings.with_(lance_threshold=threshold)).run_requests
        assert request.asset_selection == [dg.AssetKey(SEARCH_INDEXES), dg.AssetKey(GRAPH_TABLES)]
        assert "-search-" in request.run_key
        requests[threshold] = request.run_key
    assert requests[1] != requests[2]  # another setting is another request, never deduplicated away
