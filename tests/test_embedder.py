"""The embedder's real input limit: 254 word pieces for all-MiniLM-L6-v2, from the model's own
configuration; chunks over it are refused, long queries are windowed and pooled, nothing is truncated."""
import logging

import numpy as np
import polars as pl
import pytest

from lexgraph.indexing.pipeline import CHUNK_COLUMNS
from lexgraph.extract.embedder import Embedder, InputTooLongError, model_input_limit


def first_pieces(embedder: Embedder, text: str, n: int) -> str:
    """The prefix of text that is exactly its first n word pieces."""
    spans = embedder.token_spans(text)
    assert len(spans) >= n
    prefix = text[: spans[n - 1][1]]
    assert embedder.count_tokens([prefix]) == [n]
    return prefix


def agree(embedder: Embedder, a: np.ndarray, b: np.ndarray) -> bool:
    """The same text's vectors from two model calls: equal under torch; under onnx-int8 the activations'
    int8 scale is set per batch, so a text's vector moves a little with its batch-mates."""
    if embedder.backend != "onnx-int8":
        return bool(np.allclose(a, b, atol=1e-5))
    return float(np.dot(a, b)) >= 0.98


def test_limit_comes_from_the_model_configuration(embedder):
    assert model_input_limit("all-MiniLM-L6-v2") == 254
    assert Embedder.shared().max_tokens == 254
    # the model itself keeps its 256 positions ([CLS] + 254 + [SEP]): it never sees more
    assert embedder.max_seq_length == 256
    assert embedder.model.max_seq_length == 256


def test_the_model_never_sees_more_than_its_limit(embedder, corpus_text):
    features = embedder.model.tokenize([corpus_text])
    assert features["input_ids"].shape[1] == 256


def test_counting_long_text_works_without_warnings(embedder, corpus_text, caplog, capfd):
    with caplog.at_level(logging.WARNING):
        counts = embedder.count_tokens([corpus_text, corpus_text[:100]])
        spans = embedder.token_spans(corpus_text)
    assert counts[0] > 2000 and counts[0] == len(spans)
    assert not [r for r in caplog.records if "sequence length" in r.getMessage()]
    assert "sequence length" not in capfd.readouterr().err


def test_chunk_embedding_refuses_over_long_text(embedder, corpus_text):
    over = first_pieces(embedder, corpus_text, 255)
    with pytest.raises(InputTooLongError, match="254-token input limit"):
        embedder.embed([over])
    assert embedder.embed([first_pieces(embedder, corpus_text, 254)]).shape == (1, embedder.dimension)


@pytest.mark.parametrize("pieces", [300, 2000])
def test_long_query_is_windowed_and_pooled(embedder, corpus_text, pieces):
    query = first_pieces(embedder, corpus_text, pieces)
    vector = embedder.embed_query(query)
    assert vector.shape == (embedder.dimension,)
    assert np.isfinite(vector).all()
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    # every window fits the model: the pooled vector is built from untruncated pieces
    assert all(n <= embedder.max_tokens for _, n in embedder._windows(query))


def test_pooled_query_uses_every_word_piece(embedder, corpus_text):
    query = first_pieces(embedder, corpus_text, 300)
    truncated = embedder.embed([first_pieces(embedder, corpus_text, 254)])[0]
    pooled = embedder.embed_query(query)
    assert not np.allclose(pooled, truncated, atol=1e-3)
    # the batch path used for a question and its clauses pools too, and agrees with the single path
    batch = embedder.embed_queries([query, "short clause"])
    assert agree(embedder, batch[0], pooled)
    assert agree(embedder, batch[1], embedder.embed(["short clause"])[0])


def test_short_query_is_one_plain_embedding(embedder):
    assert np.allclose(embedder.embed_query("Who runs Kestrel?"), embedder.embed(["Who runs Kestrel?"])[0],
                       atol=1e-6)


def test_chunk_limit_check_fails_for_an_over_long_chunk(embedder, corpus_text):
    from assets.documents import _chunk_checks

    text = first_pieces(embedder, corpus_text, 300)
    row = {"chunk_id": "c1", "doc_id": "d1", "order": 0, "text": text, "char_start": 0, "char_end": len(text),
           "heading_path": "", "token_count": 300, "source_path": "a.md", "content_hash": "h"}
    frame = pl.DataFrame([row], schema=CHUNK_COLUMNS)
    checks = {c.check_name: c for c in _chunk_checks(frame, Embedder.shared().max_tokens)}
    assert checks["chunks_within_embedder_limit"].passed is False
    assert checks["chunks_within_embedder_limit"].metadata["over_limit"].value == 1
    within = frame.with_columns(pl.lit(254, dtype=pl.Int32).alias("token_count"))
    checks = {c.check_name: c for c in _chunk_checks(within, Embedder.shared().max_tokens)}
    assert checks["chunks_within_embedder_limit"].passed is True


def test_inside_one_block_a_text_is_embedded_once_and_the_next_block_starts_afresh(embedder, corpus_text):
    """A document's statements repeat its keyword sentences: inside reusing_recent_vectors() (one ingest) their
    vectors are reused, and the token count says what the model ran on. Outside a block, and in the next one,
    nothing of an earlier block is reused. A pooled (over-long) text is never kept: its vector is not its own."""
    from lexgraph.extract.embedder import reusing_recent_vectors

    sentences = [s for s in corpus_text.split(". ") if 3 < len(s) < 300][:40]
    fresh = [f"An unseen sentence number {i} about berth fees." for i in range(5)]
    long = first_pieces(embedder, corpus_text, embedder.max_tokens + 40)

    def tokens_of(texts, **kwargs) -> tuple[int, int]:
        before = (embedder.stats.tokens, embedder.stats.reused_texts)
        embedder.embed(texts, **kwargs)
        return embedder.stats.tokens - before[0], embedder.stats.reused_texts - before[1]

    with reusing_recent_vectors():
        first = embedder.embed(sentences[:30])
        before = (embedder.stats.tokens, embedder.stats.reused_texts)
        counted = []
        again = embedder.embed(sentences[20:40] + fresh + sentences[25:27], progress=counted.append)
        assert embedder.stats.reused_texts - before[1] == 10
        assert embedder.stats.tokens - before[0] == sum(embedder.count_tokens(sentences[30:40] + fresh))
        assert sum(counted) == 25  # every unique text is reported, reused or embedded
        for i in range(10):  # sentences 20-29: the vectors of the first call
            assert agree(embedder, again[i], first[20 + i])
        assert agree(embedder, again[25], first[25]) and agree(embedder, again[-1], first[26])
        once, _ = tokens_of([long], long="pool")
        assert once > embedder.max_tokens and tokens_of([long], long="pool") == (once, 0)
    whole = sum(embedder.count_tokens(sentences[:10]))
    assert tokens_of(sentences[:10]) == (whole, 0)  # outside a block
    with reusing_recent_vectors():
        assert tokens_of(sentences[:10]) == (whole, 0)  # a new block: the last one's vectors are gone
        assert tokens_of(sentences[:10]) == (0, 10)


def test_recent_vectors_drop_the_least_recently_used_first():
    from lexgraph.extract.embedder import RecentVectors

    recent = RecentVectors(max_bytes=3 * 2 * 4, dimension=2)  # room for three vectors of two floats
    recent.keep(["a", "b", "c"], np.eye(3, 2, dtype=np.float32))
    assert recent.found(["a"]).keys() == {"a"}  # "a" is now the most recent
    recent.keep(["d"], np.ones((1, 2), dtype=np.float32))
    assert recent.found(["a", "b", "c", "d"]).keys() == {"a", "c", "d"}
    assert RecentVectors(max_bytes=4, dimension=2).found(["a"]) == {}


def test_an_ingest_embeds_the_statements_that_repeat_keyword_sentences_once(tiny_corpus, home, instance):
    """The LLM-free extractor's statements are keyword sentences of the same chunks: the ingest that embedded
    those for the keyword index reuses their vectors for the statements' rows, which equal a lone embedding."""
    from lexgraph.settings import Settings
    from lexgraph.storage.vector_store import VectorStore
    from orchestration.runner import ingest_folder

    embedder = Embedder.shared(backend=Settings.from_env(home=home).embed_backend)
    before = embedder.stats.reused_texts
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert embedder.stats.reused_texts > before
    rows = pl.from_arrow(VectorStore(Settings.from_env(home=home).lance_uri).db.open_table("statements").to_arrow())
    alone = embedder.embed(rows["text"].to_list())
    assert all(agree(embedder, mine, lone) for mine, lone in zip(rows["vector"].to_numpy(), alone))


def test_long_texts_go_to_the_model_in_batches_within_the_token_budget(embedder, corpus_text, monkeypatch):
    """Chunk-length texts are split into calls of at most BATCH_TOKEN_BUDGET padded word pieces, short ones
    still batch_size at a time, and every vector is the one the text gets alone."""
    from lexgraph.extract.embedder import BATCH_TOKEN_BUDGET

    long = [first_pieces(embedder, corpus_text[i * 40:], 200) for i in range(20)]
    short = [f"note {i} on the harbour" for i in range(100)]
    calls: list[list[str]] = []
    encode = embedder._encode_batch
    monkeypatch.setattr(embedder, "_encode_batch", lambda batch: calls.append(batch) or encode(batch))
    vectors = embedder.embed(long + short)
    pieces = [max(embedder.count_tokens(batch)) + 2 for batch in calls]
    assert all(len(batch) * n <= BATCH_TOKEN_BUDGET for batch, n in zip(calls, pieces) if len(batch) > 1)
    # 20 texts of 200 word pieces: two calls of 10; then the 100 short ones, batch_size (64) a call
    assert [len(batch) for batch in calls] == [BATCH_TOKEN_BUDGET // 202] * 2 + [embedder.batch_size, 36]
    alone = np.stack([encode([text])[0] for text in long[:3] + short[:3]])
    assert all(agree(embedder, a, b) for a, b in zip(vectors[[0, 1, 2, 20, 21, 22]], alone))
