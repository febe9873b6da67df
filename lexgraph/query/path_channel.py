"""The lexical graph's ``path`` retrieval channel (DESIGN.md §5, issue 9): MiniRAG-style path scoring, short
entity paths from the query's entities toward entities of the type the question asks for.

It reads the entity graph :func:`lexgraph.query.graph_channels.load_lexical_graph` put in
``RetrievalIndex.graph.entities`` (entity vectors, names, relation shares, the entity→chunk mention matrix,
idf) and, once per loaded graph, the entities' types from the LanceDB ``entities`` table (the resolver's
majority type; an index without the column treats every entity as "other").

**Start entities** (:func:`start_entities`): the entity names found verbatim in the query
(:func:`graph_channels.query_entities`, weight ``path_exact_weight``), runs of two or more words of a longer
name ("Helene Strand" for "Professor Helene Strand", 0.8 of that weight, when the run names one entity only),
and the ``path_start_top`` nearest entity vectors (weighted by their cosine with the query).

**Answer types** (:func:`answer_types`): the question word, or the noun after "which"/"what", names the entity
types a good answer has: who → person, organization; where → location; when / what year → date, event;
how much → money; "which company" → organization, "which ship" → vessel... (the offline extractor's and the
LLM schema's types, ``lexgraph.extract.schemas.DEFAULT_ENTITY_TYPES``). A question with none gives no bonus.

**Paths** (:func:`find_paths`): a beam search along the relations, at most ``path_hops`` hops (1–2), each node
followed to its ``path_fanout`` strongest relations, the ``path_beam`` best partial paths carried to the next
hop; the ``path_max_paths`` best paths are kept in all. A path s → … → e scores

    weight(s) × path_hop_decay^(hops − 1) × (geometric mean of its edge strengths)
              × (relevance(e) + path_type_bonus × [type(e) is an answer type]
                 + path_bridge_bonus × weight(e) when s and e are both named in the query)

where an edge's strength is its relation strength relative to the strongest relation of the node it leaves
(so a hub's many weak co-occurrences count little), relevance(e) is the end entity's cosine with the query,
and a path never revisits a start entity. The start entities themselves are 0-hop paths, scored
``path_self_weight`` × weight × (relevance + type bonus).

**Chunks**: a path hands its score to the chunks that mention its entities, in the share
(Σ role weight × idf share of the entities mentioned) / (Σ role weights), with roles end 1, start
``path_start_share``, middle ``path_mid_share`` (idf share = idf / max idf: an entity in every chunk adds
little), so a chunk where start and end co-occur gets the most. A chunk's evidence is its best path + ``path_sum_weight``
× the sum of the others; the channel scores the chunks with evidence by query–chunk cosine + ``path_evidence_weight``
× evidence / max evidence, as the keyword and entity channels do. Everything else is -inf, as is every chunk of an
index without a lexical graph.

No Dagster here (DESIGN.md §2).
"""
from __future__ import annotations

import math
import re
import threading
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lexgraph.extract.schemas import DEFAULT_ENTITY_TYPES, FALLBACK_TYPE, normalise_entity_type
from lexgraph.indexing.name_keys import normalise_entity_name
from lexgraph.extract.keywords import STOPWORDS
from lexgraph.query.graph_channels import (MAX_NAME_WORDS, MAX_QUERY_WORDS, compact_key, query_entities,
                                          rerank_refs)
from lexgraph.query.retrieval_types import EntityGraph, RetrievalIndex, RetrievalParams
from lexgraph.storage.vector_store import ENTITIES, VectorStore

# Only the start of a question is read for its question word and answer noun.
_HEAD_CHARS = 400
_WORD = re.compile(r"[a-z]+")

# question words -> answer types
_QUESTION_WORDS: dict[str, tuple[str, ...]] = {
    "who": ("person", "organization"), "whom": ("person", "organization"), "whose": ("person", "organization"),
    "where": ("location",), "whereabouts": ("location",),
    "when": ("date", "event"),
}
# nouns after which / what / how (and "in what year"): the answer's type
_ANSWER_NOUNS: dict[str, tuple[str, ...]] = {
    **{w: ("person",) for w in (
        "person", "people", "man", "woman", "men", "women", "player", "actor", "actress", "singer", "author",
        "writer", "director", "president", "ceo", "chairman", "chair", "captain", "founder", "owner", "artist",
        "composer", "member", "leader", "king", "queen", "manager", "arbitrator", "signatory", "employee",
        "friend", "colleague", "neighbour", "neighbor", "producer", "musician", "band member", "character",
        "politician", "coach", "scientist", "wife", "husband", "son", "daughter", "father", "mother", "brother",
        "sister", "spouse", "partner")},
    **{w: ("organization",) for w in (
        "company", "companies", "organisation", "organization", "firm", "business", "corporation", "agency",
        "institution", "team", "club", "band", "group", "university", "school", "college", "party", "supplier",
        "customer", "client", "vendor", "subsidiary", "insurer", "bank", "network", "label", "publisher",
        "studio", "store", "shop", "restaurant", "brand", "operator", "contractor", "airline", "shipbuilder",
        "shipyard", "yard", "manufacturer", "maker", "builder", "employer", "broadcaster", "channel")},
    **{w: ("location",) for w in (
        "place", "location", "city", "town", "country", "state", "region", "province", "county", "village",
        "port", "site", "venue", "river", "island", "continent", "capital", "street", "address", "area",
        "district", "headquarters", "park", "building", "mountain", "lake", "sea", "ocean", "nation")},
    **{w: ("date", "event") for w in (
        "year", "years", "date", "day", "month", "time", "century", "decade", "season", "week", "period", "era")},
    **{w: ("event",) for w in ("event", "meeting", "match", "game", "war", "battle", "festival", "concert",
                               "election", "tournament", "competition", "ceremony", "conference", "party")},
    **{w: ("vessel",) for w in ("vessel", "ship", "boat", "hull", "tanker", "ferry")},
    **{w: ("contract",) for w in ("contract", "agreement", "order", "amendment", "treaty", "deal")},
    **{w: ("product",) for w in ("product", "engine", "device", "model", "item", "software", "app", "game",
                                 "book", "album", "song", "film", "movie", "show", "series")},
    **{w: ("money",) for w in ("price", "cost", "amount", "fee", "salary", "budget", "value", "sum", "fine",
                               "penalty")},
}
PARTIAL_NAME_SHARE = 0.8  # a start entity named in part ("Helene Strand") weighs this share of a full name
_FILLERS = {"is", "was", "are", "were", "the", "a", "an", "name", "names", "of", "kind", "type", "sort", "exact",
            "specific", "particular", "other", "two", "one"}
_DETERMINERS = {"which", "what", "whose", "waht"}


def answer_types(question: str, allowed: tuple[str, ...] = DEFAULT_ENTITY_TYPES) -> frozenset[str]:
    """The entity types a good answer to this question has (empty when the question does not say)."""
    words = _WORD.findall(question[:_HEAD_CHARS].casefold())
    wanted: list[str] = []
    for i, word in enumerate(words[:12]):
        if word in _QUESTION_WORDS:
            wanted += _QUESTION_WORDS[word]
            if word != "whose":
                break
        if word in _DETERMINERS:
            # "which company", "what year", "in what city", "what is the name of the ship": the first word
            # after the determiner that is not a filler
            noun = next((w for w in words[i + 1:i + 8] if w not in _FILLERS), "")
            kinds = _ANSWER_NOUNS.get(noun) or _ANSWER_NOUNS.get(noun[:-1] if noun.endswith("s") else noun)
            if not kinds and noun:
                kind = normalise_entity_type(noun, allowed)
                kinds = (kind,) if kind != FALLBACK_TYPE else ()
            wanted += kinds or ()
            break
        if word == "how" and i + 1 < len(words):
            follower = words[i + 1]
            if follower in ("much", "expensive"):
                wanted.append("money")
            elif follower in ("long", "old", "soon"):
                wanted += ["date", "event"]
            break
    return frozenset(kind for kind in wanted if kind in allowed)


# ---------------------------------------------------------------------------------------------
# entity types, read once per loaded entity graph

_TYPES_LOCK = threading.Lock()


def entity_types(index: RetrievalIndex, graph: EntityGraph, rows=None) -> np.ndarray:
    """The entities' types (an object array aligned with `rows`, or with graph.ids when rows is None); "other"
    where none is known. A graph that knows its types (the lance graph) answers; the memory graph's are read from
    the LanceDB entities table on first use and kept on the graph object."""
    if hasattr(graph, "types_of"):
        return graph.types_of(rows)
    types = _memory_types(index, graph)
    return types if rows is None else types[np.asarray(rows, dtype=np.int64)]


def _memory_types(index: RetrievalIndex, graph: EntityGraph) -> np.ndarray:
    cached = getattr(graph, "_path_types", None)
    if cached is not None:
        return cached
    with _TYPES_LOCK:
        cached = getattr(graph, "_path_types", None)
        if cached is not None:
            return cached
        types = np.full(graph.size, FALLBACK_TYPE, dtype=object)
        try:
            store = VectorStore(index.settings.lance_uri)
            if ENTITIES in store.table_names():
                table = store.db.open_table(ENTITIES).to_arrow()
                if "entity_type" in table.schema.names and "entity_id" in table.schema.names:
                    row_of = {e: i for i, e in enumerate(graph.ids)}
                    for entity, kind in zip(table.column("entity_id").to_pylist(),
                                            table.column("entity_type").to_pylist()):
                        if entity in row_of and kind:
                            types[row_of[entity]] = str(kind)
        except Exception as error:  # noqa: BLE001 - a damaged table costs the type bonus, not the query
            warnings.warn(f"path channel: entity types not readable ({error}); no answer-type bonus", stacklevel=2)
        graph._path_types = types  # type: ignore[attr-defined]
        return types


def name_parts(name: str | None) -> set[str]:
    """The compact keys of the runs of two or more words inside a name of three or more (not the whole name, not
    only stopwords): what partial_names looks names up by."""
    words = normalise_entity_name(name or "").split()[:MAX_NAME_WORDS * 2]
    if len(words) < 3:
        return set()
    return {"".join(words[start:end]) for start in range(len(words))
            for end in range(start + 2, min(start + MAX_NAME_WORDS, len(words)) + 1)
            if end - start != len(words) and not all(w in STOPWORDS for w in words[start:end])}


def partial_names(graph: EntityGraph) -> dict[str, int]:
    """Runs of two or more words inside longer entity names ("Helene Strand" in "Professor Helene Strand"),
    by compact key, each naming exactly one entity (ambiguous runs and full names are dropped). Built on first use."""
    cached = getattr(graph, "_path_partials", None)
    if cached is not None:
        return cached
    runs: dict[str, int] = {}
    ambiguous: set[str] = set()
    for i, name in enumerate(graph.names):
        for key in name_parts(name):
            if key in graph.lookup:
                continue
            if runs.get(key, i) != i:
                ambiguous.add(key)
            runs[key] = i
    for key in ambiguous:
        runs.pop(key, None)
    graph._path_partials = runs  # type: ignore[attr-defined]
    return runs


def partial_name_keys(query: str) -> list[str]:
    """The compact keys of the query's runs of two or more words: what a part of a longer name is looked up by."""
    words = re.findall(r"\S+", query[: MAX_QUERY_WORDS * 64])[:MAX_QUERY_WORDS]
    return [compact_key(" ".join(words[start:end])) for start in range(len(words))
            for end in range(start + 2, min(start + MAX_NAME_WORDS, len(words)) + 1)]


def partial_query_entities(graph: EntityGraph, query: str) -> list[int]:
    """Entities a run of the query's words names in part (two or more words of a longer name)."""
    if hasattr(graph, "partly_named"):
        return list(dict.fromkeys(graph.partly_named(partial_name_keys(query))))
    runs = partial_names(graph)
    if not runs:
        return []
    return list(dict.fromkeys(runs[key] for key in partial_name_keys(query) if key in runs))


# ---------------------------------------------------------------------------------------------
# paths


@dataclass(frozen=True)
class EntityPath:
    nodes: tuple[int, ...]  # entity rows, start first (one node: the start entity alone)
    score: float
    edges: tuple[float, ...]  # relative strength of each edge
    fits: bool  # the end entity's type is an answer type

    @property
    def hops(self) -> int:
        return len(self.nodes) - 1


def start_entities(graph: EntityGraph, query: str, query_vector: np.ndarray, params: RetrievalParams) -> dict[int, float]:
    """Start entities and their weights: verbatim names in the query (a part of a longer name: 0.8 of the
    weight), then the nearest entity vectors."""
    starts: dict[int, float] = {}
    for i in partial_query_entities(graph, query):
        starts[i] = PARTIAL_NAME_SHARE * params.path_exact_weight
    for i in query_entities(graph, query):
        starts[i] = params.path_exact_weight
    top = min(max(params.path_start_top, 0), graph.size)
    if top > 0:
        rows, similarity = graph.nearest(query_vector, top)
        for i, value in zip(rows.tolist(), similarity.tolist()):
            if value > 0 and value > starts.get(int(i), 0.0):
                starts[int(i)] = float(value)
    return starts


class _EndValues:
    """An entity's value as a path's end: its relevance to the query (cosine, clipped at 0) plus the type bonus
    when its type is an answer type; read for the entities the paths reach, a hop at a time."""

    def __init__(self, index: RetrievalIndex, graph: EntityGraph, query: str, query_vector: np.ndarray, bonus: float):
        self.index, self.graph, self.query_vector, self.bonus = index, graph, query_vector, bonus
        self.wanted = answer_types(query)
        self.relevance: dict[int, float] = {}
        self.fits: dict[int, bool] = {}

    def read(self, rows) -> None:
        new = np.array(sorted({int(r) for r in rows} - self.relevance.keys()), dtype=np.int64)
        if not len(new):
            return
        similarity = np.clip(self.graph.similarity(self.query_vector, new), 0, None)
        types = entity_types(self.index, self.graph, new)
        for row, value, kind in zip(new.tolist(), similarity.tolist(), types.tolist()):
            self.relevance[row] = float(value)
            self.fits[row] = kind in self.wanted

    def __call__(self, row: int) -> float:
        return self.relevance[row] + (self.bonus if self.fits[row] else 0.0)


def find_paths(index: RetrievalIndex, graph: EntityGraph, query: str, query_vector: np.ndarray,
               params: RetrievalParams) -> list[EntityPath]:
    """The best entity paths for the query, best first, within the hop, fan-out, beam and path budgets."""
    limit = max(params.path_max_paths, 0)
    if limit == 0 or graph.size == 0:
        return []
    starts = start_entities(graph, query, query_vector, params)
    if not starts:
        return []
    named = {s for s, weight in starts.items() if weight >= PARTIAL_NAME_SHARE * params.path_exact_weight}
    end_value = _EndValues(index, graph, query, query_vector, params.path_type_bonus)
    end_value.read(starts)
    paths: list[EntityPath] = []
    if params.path_self_weight > 0:
        for s, weight in starts.items():
            score = params.path_self_weight * weight * end_value(s)
            if score > 0:
                paths.append(EntityPath((s,), score, (), end_value.fits[s]))
    fanout = max(params.path_fanout, 1)
    # beam entries: (nodes, edge strengths, start weight, partial score)
    frontier = [((s,), (), w, w) for s, w in starts.items()]
    frontier.sort(key=lambda f: (-f[3], f[0]))
    for hop in range(1, min(max(params.path_hops, 0), 3) + 1):
        if not frontier or not graph.has_relations:
            break
        grown = _grow(graph.relations_of(sorted({nodes[-1] for nodes, *_ in frontier})), frontier, hop, fanout, params)
        end_value.read(nodes[-1] for nodes, *_ in grown)
        for nodes, path_edges, _, partial in grown:
            end = nodes[-1]
            # a path joining two of the query's entities ("what links A and B") gains their bridge bonus
            bridge = params.path_bridge_bonus * starts[end] if end in named and nodes[0] in named else 0.0
            score = partial * (end_value(end) + bridge)
            if score > 0:
                paths.append(EntityPath(nodes, score, path_edges, end_value.fits[end]))
        grown.sort(key=lambda f: (-f[3], f[0]))
        frontier = grown[:max(params.path_beam, 0)]
    paths.sort(key=lambda p: (-p.score, p.nodes))
    return paths[:limit]


def _grow(relations: dict[int, tuple[np.ndarray, np.ndarray]], frontier, hop: int, fanout: int,
          params: RetrievalParams) -> list:
    """Each frontier path extended by the strongest `fanout` relations of its last entity."""
    grown = []
    for nodes, edges, weight, _ in frontier:
        neighbours, shares = relations.get(nodes[-1], (np.zeros(0, dtype=np.int64), np.zeros(0)))
        if not len(neighbours):
            continue
        strongest = float(shares.max())
        if len(neighbours) > fanout:
            keep = np.argpartition(-shares, fanout - 1)[:fanout]
            neighbours, shares = neighbours[keep], shares[keep]
        for n, share in zip(neighbours.tolist(), shares.tolist()):
            if n in nodes:
                continue
            path_edges = (*edges, share / strongest)
            strength = math.prod(path_edges) ** (1 / len(path_edges))
            partial = weight * params.path_hop_decay ** (hop - 1) * strength
            grown.append(((*nodes, n), path_edges, weight, partial))
    return grown


def path_evidence(graph: EntityGraph, paths: list[EntityPath], params: RetrievalParams,
                  query_vector: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk (refs, evidence): the best path's share + path_sum_weight × the others' (chunks no path entity
    is mentioned in are left out). query_vector: what a store-backed graph bounds a hub entity's chunks by."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
    if not paths:
        return empty
    idf_max = max(graph.idf_max, 1e-12)
    weighted: list[dict[int, float]] = []
    for path in paths:
        roles: dict[int, float] = {}
        for position, node in enumerate(path.nodes):
            if position == len(path.nodes) - 1:
                role = 1.0
            elif position == 0:
                role = params.path_start_share
            else:
                role = params.path_mid_share
            roles[node] = max(roles.get(node, 0.0), role)
        weighted.append({node: role / sum(roles.values()) for node, role in roles.items() if role > 0})
    nodes = sorted({node for roles in weighted for node in roles})
    idf_share = dict(zip(nodes, (graph.idf_of(nodes) / idf_max).tolist()))
    mentioned = dict(zip(nodes, graph.chunks_of(nodes, query_vector)))
    path_rows, refs, values = [], [], []
    for p, (path, roles) in enumerate(zip(paths, weighted)):
        for node, share in roles.items():
            chunks = mentioned[node]
            path_rows.append(np.full(len(chunks), p))
            refs.append(chunks)
            values.append(np.full(len(chunks), path.score * share * idf_share[node]))
    if not refs or not sum(len(r) for r in refs):
        return empty
    unique, column = np.unique(np.concatenate(refs), return_inverse=True)
    per_path = sp.csr_matrix((np.concatenate(values), (np.concatenate(path_rows), column)),
                             shape=(len(paths), len(unique)))  # paths × chunks; a node's repeats add up
    best = per_path.max(axis=0).toarray().ravel()
    total = np.asarray(per_path.sum(axis=0)).ravel()
    return unique, best + params.path_sum_weight * (total - best)


def path_scores(index: RetrievalIndex, query: str, query_vector: np.ndarray, params: RetrievalParams) -> np.ndarray:
    """The path channel: a score per chunk (-inf where no path of the query's entities reaches it)."""
    graph = index.graph.entities if index.graph is not None else None
    if graph is None or graph.size == 0 or not graph.has_mentions:
        return np.full(index.size, -np.inf)
    refs, evidence = path_evidence(graph, find_paths(index, graph, query, query_vector, params), params, query_vector)
    return rerank_refs(index, query_vector, refs, evidence, params.path_evidence_weight)
