"""A synthetic index of N chunks that the real `lexgraph ingest` accepts as its existing index.

Why: building 100,000 chunks through the real embedder takes hours on 2 cores, yet the cost of
adding one document in a new process (loading the index, the KNN state, the keyword and lexical
graphs) only shows on an index that large. So the index is built by lexgraph's own ingestion,
through the Dagster asset graph (`orchestration.runner.ingest_with_default_instance`, the path
`lexgraph ingest` runs), with two things synthetic:

- the documents: Markdown files of pseudo-words (syllable strings) written into an inbox, one
  `## heading` section per chunk, words drawn 70% from a global Zipf vocabulary and 30% from a
  per-topic one (about 60k distinct keywords at 100k chunks), 5% of them proper names (4 per
  topic). Everything after that is real:
  reading, chunking (the model's own tokenizer), keywords, heuristic extraction, Kùzu and
  LanceDB writes, and the corpus job (KNN, PageRank, skeleton, keyword index, lexical graph);
- the vectors: the embedder resource hands the assets a SyntheticEmbedder that counts tokens
  with the real model's tokenizer but returns clustered random unit vectors. A chunk's vector is
  topic + 0.8·subtopic + 0.6·noise, normalised, its topic and subtopic read from markers in the
  chunk's heading (as in bench_scale's generator); every other text (keyword sentences,
  statements, entities) gets a noise vector seeded by its text. Its token counts in the cost
  ledger are len(text)/4 estimates, not model counts.

The index lives under `<cache>/home`, the inbox under `<cache>/inbox`, and `<cache>` is keyed by
the generator's parameters; the index folder inside the home comes from `Settings` (collection,
index version) like every lexgraph command. `ready.json` in the index folder marks a finished
build.

    python -m benchmarks.synthetic_index --chunks 100000 --doc-chunks 50
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# Bump when the generated text or vectors change: the cache key then changes with it.
GENERATOR_VERSION = 2
DIM = 384
WORDS_PER_CHUNK = 60
WORDS_PER_SENTENCE = 12
# Sized so that 100k chunks hold about 60k distinct keywords, as a real corpus of ~6M words would (Heaps'
# law), not one new word per draw: the keyword index's cost grows with it.
GLOBAL_VOCABULARY = 30_000
TOPIC_POOL = 20_000  # topic words come from one pool, each topic using its own TOPIC_VOCABULARY of them
TOPIC_VOCABULARY = 200
NAMES_PER_TOPIC = 4  # proper names (entities) per topic
NAME_SHARE = 0.05  # share of word slots holding a proper name
CLUSTER_SIZE = 50
SUBTOPIC_SIZE = 5
# Syllables of the pseudo-words; markers start with letters outside them, so they never occur by chance.
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]
TOPIC_MARK, SUBTOPIC_MARK = "Qu", "Xe"
_MARKER = re.compile(rf"\b({TOPIC_MARK}|{SUBTOPIC_MARK})((?:[{_CONSONANTS}][{_VOWELS}])+)\b")
# Environment variables that would make the build or the add differ from a plain local `lexgraph ingest`.
_UNSET = ("DAGSTER_HOME", "LEXGRAPH_HOME", "LEXGRAPH_LLM_BASE_URL", "OPENAI_BASE_URL", "LEXGRAPH_INBOX")
READY = "ready.json"


@dataclass(frozen=True)
class CorpusSpec:
    """What the generator makes: `chunks` chunks in documents of `doc_chunks` chunks each."""

    chunks: int
    doc_chunks: int = 100
    seed: int = 7

    def __post_init__(self) -> None:
        if self.chunks < 1:
            raise ValueError(f"the synthetic index needs at least 1 chunk, got {self.chunks}")
        if self.doc_chunks < 1:
            raise ValueError(f"documents need at least 1 chunk each, got {self.doc_chunks}")

    @property
    def documents(self) -> int:
        return -(-self.chunks // self.doc_chunks)

    @property
    def topics(self) -> int:
        return max(1, self.chunks // CLUSTER_SIZE)

    @property
    def subtopics(self) -> int:
        return max(1, self.chunks // SUBTOPIC_SIZE)

    def key(self) -> str:
        return f"synthetic-{self.chunks}-{self.doc_chunks}-{self.seed}-g{GENERATOR_VERSION}"


def word(n: int, syllables: int = 2) -> str:
    """The n-th pseudo-word: n in base len(_SYLLABLES), at least `syllables` syllables long."""
    parts = []
    while n or len(parts) < syllables:
        n, digit = divmod(n, len(_SYLLABLES))
        parts.append(_SYLLABLES[digit])
    return "".join(reversed(parts))


def _number(letters: str) -> int:
    value = 0
    for i in range(0, len(letters), 2):
        value = value * len(_SYLLABLES) + _SYLLABLES.index(letters[i : i + 2])
    return value


def markers(text: str) -> tuple[int | None, int | None]:
    """(topic, subtopic) named in a text's markers, None where it names none."""
    found = {mark: _number(letters) for mark, letters in _MARKER.findall(text)}
    return found.get(TOPIC_MARK), found.get(SUBTOPIC_MARK)


# --- documents -----------------------------------------------------------------------------------


def _topic_word(topic: int, rank: int) -> str:
    """The rank-th word of a topic's vocabulary: a spread-out subset of the shared topic pool."""
    return word(GLOBAL_VOCABULARY + (topic * 7919 + (rank % TOPIC_VOCABULARY) * 104_729) % TOPIC_POOL, 3)


def _name(topic: int, which: int) -> str:
    return word(GLOBAL_VOCABULARY + TOPIC_POOL + topic * NAMES_PER_TOPIC + which, 3).capitalize()


def _sentences(rng: np.random.Generator, topic: int, words: int) -> str:
    ranks = rng.zipf(1.2, size=words)
    kind = rng.random(words)
    tokens = []
    for rank, draw in zip(ranks.tolist(), kind.tolist()):
        if draw < NAME_SHARE:
            tokens.append(_name(topic, rank % NAMES_PER_TOPIC))
        elif draw < 0.3:
            tokens.append(_topic_word(topic, rank))
        else:
            tokens.append(word(rank % GLOBAL_VOCABULARY))
    sentences = []
    for start in range(0, words, WORDS_PER_SENTENCE):
        part = tokens[start : start + WORDS_PER_SENTENCE]
        sentences.append(" ".join([part[0].capitalize(), *part[1:]]) + ".")
    return " ".join(sentences)


def document_text(spec: CorpusSpec, doc: int, chunks: int | None = None) -> str:
    """Document `doc`: one `## heading` section per chunk, each naming its topic and subtopic. Most sections
    of a document share its main topic, as real documents do."""
    rng = np.random.default_rng([spec.seed, doc])
    main = doc % spec.topics
    lines = [f"# Dossier {word(doc, 3).capitalize()}", ""]
    for section in range(spec.doc_chunks if chunks is None else chunks):
        subtopic = int(rng.integers(0, spec.subtopics))
        if rng.random() < 0.7:  # a subtopic of the document's main topic
            subtopic = subtopic - subtopic % spec.topics + main
            if subtopic >= spec.subtopics:
                subtopic = main
        topic = subtopic % spec.topics
        lines += [f"## {TOPIC_MARK}{word(topic)} {SUBTOPIC_MARK}{word(subtopic)} part {section + 1}", "",
                  _sentences(rng, topic, WORDS_PER_CHUNK), ""]
    return "\n".join(lines)


def document_name(doc: int) -> str:
    return f"dossier-{doc:06d}.md"


def write_inbox(spec: CorpusSpec, inbox: Path) -> None:
    inbox.mkdir(parents=True, exist_ok=True)
    for doc in range(spec.documents):
        last = spec.chunks - doc * spec.doc_chunks
        (inbox / document_name(doc)).write_text(document_text(spec, doc, min(spec.doc_chunks, last)))


# --- vectors -------------------------------------------------------------------------------------


def _unit(*seed: int) -> np.ndarray:
    raw = np.random.default_rng(list(seed)).standard_normal(DIM).astype(np.float32)
    return raw / np.linalg.norm(raw)


def _text_seed(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def synthetic_vector(text: str, seed: int) -> np.ndarray:
    """topic + 0.8·subtopic + 0.6·noise, normalised: cosine ~0.82 inside a subtopic, ~0.5 inside a topic."""
    topic, subtopic = markers(text)
    vector = 0.6 * _unit(seed, 3, _text_seed(text))
    if topic is not None:
        vector = vector + _unit(seed, 1, topic)
    if subtopic is not None:
        vector = vector + 0.8 * _unit(seed, 2, subtopic)
    return vector / np.linalg.norm(vector)


class SyntheticEmbedder:
    """The assets' embedder for the synthetic build: the real model's tokenizer (so chunking is real), synthetic
    vectors (so no model runs). Has the attributes and methods the pipeline, the keyword index and the
    lexical graph use from lexgraph.extract.embedder.Embedder."""

    def __init__(self, real, seed: int):
        from lexgraph.extract.embedder import EmbeddingStats

        self.real, self.seed = real, seed
        self.model_name, self.dimension = real.model_name, real.dimension
        self.max_tokens, self.batch_size = real.max_tokens, real.batch_size
        self.stats = EmbeddingStats()

    def __getattr__(self, name: str):  # anything else the engine may read (the model's name, backend, ...)
        return getattr(self.real, name)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.real.count_tokens(texts)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self.real.token_spans(text)

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None,
              long: str = "refuse") -> np.ndarray:
        matrix = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            matrix[i] = synthetic_vector(text, self.seed)
        self.stats.texts += len(texts)
        self.stats.unique_texts += len(set(texts))
        self.stats.tokens += sum(len(t) // 4 for t in texts)  # an estimate: no model counts them
        if progress:
            progress(len(texts))
        return matrix

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


# --- the cached index ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticIndex:
    """Where one spec's index lives."""

    spec: CorpusSpec
    root: Path

    @classmethod
    def under(cls, spec: CorpusSpec, cache: Path | None = None) -> "SyntheticIndex":
        return cls(spec, (cache or REPO / ".lexgraph" / "bench") / spec.key())

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    def settings(self):
        from lexgraph.settings import Settings

        return Settings.from_env(home=self.home)

    @property
    def ready_file(self) -> Path:
        return self.settings().index_dir / READY

    def is_ready(self) -> bool:
        try:
            return json.loads(self.ready_file.read_text()).get("spec") == asdict(self.spec)
        except (FileNotFoundError, ValueError):
            return False


def bench_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the build and of every timed `lexgraph` process: this checkout's code first on the
    path (a baseline worktree runs its own lexgraph, not the editable install's), the heuristic extractor,
    Dagster's in-memory instance (what `lexgraph ingest` uses without DAGSTER_HOME)."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra or {})
    return env


def _use_synthetic_embedder(seed: int) -> None:
    """Every asset gets the SyntheticEmbedder from the embedder resource (this build process only), around the
    model the resource itself loads."""
    import resources

    real_get = resources.EmbedderResource.get

    def get(self):
        return SyntheticEmbedder(real_get(self), seed)

    resources.EmbedderResource.get = get


def build(index: SyntheticIndex, progress: bool = True) -> dict:
    """Write the inbox and ingest it through the asset graph with synthetic vectors. -> the ready record."""
    from orchestration.runner import ingest_with_default_instance, private_dagster_instance

    started = time.perf_counter()
    if index.root.exists():  # a build that did not finish: start over
        import shutil

        shutil.rmtree(index.root)
    write_inbox(index.spec, index.inbox)
    written = time.perf_counter()
    _use_synthetic_embedder(index.spec.seed)
    settings = index.settings()
    with private_dagster_instance():
        report = ingest_with_default_instance(index.inbox, settings=settings, progress=progress)
    if report.failed or report.corpus_index_ok is not True:
        raise RuntimeError(f"synthetic build failed: {report.corpus_error or report.failed}")
    record = {"spec": asdict(index.spec), "index_version": settings.index_version, "documents": report.new,
              "runs": len(report.runs), "inbox_seconds": round(written - started, 1),
              "build_seconds": round(time.perf_counter() - started, 1), "generator_version": GENERATOR_VERSION,
              "synthetic": "document text (pseudo-words) and all vectors; reading, chunking, keywords, heuristic "
                           "extraction, stores and corpus job are lexgraph's own, run through Dagster"}
    index.ready_file.write_text(json.dumps(record, indent=1))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (once) a synthetic index through lexgraph's ingestion.")
    parser.add_argument("--chunks", type=int, required=True)
    parser.add_argument("--doc-chunks", type=int, default=CorpusSpec.doc_chunks)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cache", type=Path, default=None, help="folder of cached indexes (.lexgraph/bench)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        spec = CorpusSpec(args.chunks, args.doc_chunks, args.seed)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    index = SyntheticIndex.under(spec, args.cache)
    if index.is_ready():
        print(json.dumps({"cached": True, **json.loads(index.ready_file.read_text())}))
        return 0
    print(json.dumps({"cached": False, **build(index, progress=not args.quiet)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
