"""The chunk_pagerank and skeleton_selection steps: PageRank over the saved KNN edges, and the β-skeleton
chosen by it with the diff against the previous selection (published for re-extraction).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl

from lexgraph.atomic_json import write_json
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_edges import EdgeRows
from lexgraph.indexing.pagerank import pagerank_of_positions
from lexgraph.indexing.skeleton import DEFAULT_BETA, SelectionDiff, frame_selection_diff, skeleton_mask, skeleton_size


def compute_pagerank(files: CorpusFiles, chunks: pl.DataFrame, edges: EdgeRows) -> pl.DataFrame:
    """PageRank over both kinds of similarity edge; chunk_id, doc_id, pagerank. chunks: the save's chunks, in
    the order the edges' positions count them."""
    if chunks.height != len(edges.chunk_ids) or (chunks.height and (chunks["chunk_id"][0], chunks["chunk_id"][-1])
                                                  != (edges.chunk_ids[0], edges.chunk_ids[-1])):
        raise ValueError("the saved edges are not of these chunks")
    scores = pagerank_of_positions(chunks.height, edges.src, edges.dst, edges.weight)
    frame = chunks.select("chunk_id", "doc_id").with_columns(pl.Series("pagerank", scores))
    files.write(files.pagerank, frame)
    return frame


@dataclass
class SkeletonResult:
    selection: pl.DataFrame  # chunk_id, doc_id, pagerank, selected
    diff: SelectionDiff
    size: int
    coverage: pl.DataFrame = field(default_factory=pl.DataFrame)  # per document: chunks, selected, share


def select(files: CorpusFiles, ranks: pl.DataFrame, beta: float = DEFAULT_BETA) -> SkeletonResult:
    """Top ⌊β·n⌋ chunks by PageRank, and the diff against the previous selection (saved for re-extraction)."""
    selection = ranks.with_columns(pl.Series("selected", skeleton_mask(ranks["chunk_id"], ranks["pagerank"], beta)))
    previous = (pl.read_parquet(files.skeleton, columns=["chunk_id", "selected"]).filter("selected")["chunk_id"]
                if files.skeleton.exists() else pl.Series("chunk_id", [], dtype=pl.String))
    diff = frame_selection_diff(previous, selection.filter("selected")["chunk_id"], ranks.select("chunk_id", "doc_id"))
    # The diff first: killed between the two writes, the next update diffs against the same previous
    # selection and publishes the same diff again.
    write_json(files.skeleton_diff, {"beta": beta, **diff.to_dict()}, indent=1)
    files.write(files.skeleton, selection)
    coverage = (selection.group_by("doc_id").agg(pl.len().alias("chunks"), pl.col("selected").sum().alias("selected"))
                .with_columns((pl.col("selected") / pl.col("chunks")).alias("share")).sort("doc_id"))
    return SkeletonResult(selection, diff, skeleton_size(ranks.height, beta), coverage)


def read_selection_diff(files: CorpusFiles) -> dict:
    """The last published selection diff, for downstream re-extraction."""
    return json.loads(files.skeleton_diff.read_text()) if files.skeleton_diff.exists() else {}
