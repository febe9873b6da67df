"""β-skeleton selection and its diff."""
from __future__ import annotations

import numpy as np
import pytest

from lexgraph.indexing.skeleton import select_skeleton, selection_diff, skeleton_size

IDS = ["c5", "c1", "c4", "c2", "c3", "c0"]
SCORES = [0.10, 0.30, 0.20, 0.20, 0.05, 0.15]


def test_beta_zero_selects_nothing_and_one_selects_everything_in_rank_order():
    assert select_skeleton(IDS, SCORES, 0.0).tolist() == []
    assert select_skeleton(IDS, SCORES, 1.0).tolist() == ["c1", "c2", "c4", "c0", "c5", "c3"]
    assert select_skeleton(IDS, SCORES, 1).tolist() == ["c1", "c2", "c4", "c0", "c5", "c3"]


def test_half_takes_the_floor_and_breaks_ties_by_chunk_id():
    assert select_skeleton(IDS, SCORES, 0.5).tolist() == ["c1", "c2", "c4"]
    assert select_skeleton(IDS, SCORES, 0.34).tolist() == ["c1", "c2"]  # ⌊2.04⌋ = 2: c2 wins the tie with c4
    assert select_skeleton(IDS, SCORES, 0.8).tolist() == ["c1", "c2", "c4", "c0"]  # ⌊4.8⌋ = 4


def test_floor_is_not_fooled_by_floating_point():
    assert 0.29 * 100 < 29
    assert skeleton_size(100, 0.29) == 29
    assert skeleton_size(0, 0.8) == 0


@pytest.mark.parametrize("beta", [-0.1, 1.5, float("nan"), "0.5", None, True])
def test_invalid_beta_is_refused(beta):
    with pytest.raises(ValueError, match="beta"):
        select_skeleton(IDS, SCORES, beta)


def test_mismatched_or_repeated_ids_are_refused():
    with pytest.raises(ValueError, match="equal length"):
        select_skeleton(IDS, SCORES[:-1], 0.5)
    with pytest.raises(ValueError, match="unique"):
        select_skeleton(["a", "a"], [0.5, 0.5], 0.5)


def test_selection_diff_names_changed_chunks_and_their_documents():
    chunk_to_doc = {"a1": "A", "a2": "A", "b1": "B", "c1": "C", "d1": "D"}
    diff = selection_diff(["a1", "b1", "gone1"], ["a1", "c1", "d1"], chunk_to_doc)
    assert diff.newly_selected == ("c1", "d1")
    assert diff.deselected == ("b1", "gone1")
    assert diff.documents == ("B", "C", "D")  # gone1's document was removed: nothing to re-extract
    assert diff.to_dict() == {
        "newly_selected": ["c1", "d1"],
        "deselected": ["b1", "gone1"],
        "documents": ["B", "C", "D"],
        "newly_selected_count": 2,
        "deselected_count": 2,
        "document_count": 3,
    }


def test_unchanged_selection_has_an_empty_diff():
    diff = selection_diff(np.array(["x", "y"]), ["y", "x"], {"x": "X", "y": "Y"})
    assert diff.to_dict()["document_count"] == 0 and not diff.newly_selected and not diff.deselected
