"""The terms a chunk or a question is searched by: lowercase alphanumeric words without stopwords, camel-case
words also as their parts. The in-memory BM25 counts them, and the chunk table stores them (`search_text`) so
that LanceDB's full-text index counts the very same terms (its own tokenizer stems, keeps other stopwords and
cannot split "WolfgangSchulz"). Base layer: storage writes them, extraction and the query side read them."""
from __future__ import annotations

import re

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above across after afterwards again against all almost alone along already also although
    always am among amongst an and another any anybody anyhow anyone anything anyway anywhere are
    around as at back be became because become becomes been before beforehand behind being below
    beside besides between beyond both but by can cannot could did do does doing done down during
    each either else elsewhere enough even ever every everybody everyone everything everywhere
    except few for former formerly from further had has have having he hence her here hereby
    herein hers herself him himself his how however i if in indeed into is it its itself just
    last latter least less like many may me meanwhile might mine more moreover most mostly much
    must my myself namely neither never nevertheless next no nobody none noone nor not nothing now
    nowhere of off often on once one only onto or other others otherwise our ours ourselves out
    over own per perhaps quite rather really same see seem seemed seems several shall she should
    since so some somebody somehow someone something sometime sometimes somewhere still such than
    that the their theirs them themselves then thence there thereafter thereby therefore therein
    these they this those though through throughout thru thus to together too toward towards
    under until up upon us very via was we well were what whatever when whence whenever where
    whereas whereby wherever whether which while whither who whoever whole whom whose why will
    with within without would yet you your yours yourself yourselves
    get gets got getting go goes going gone make makes made let lets say says said
    ok okay oh hey hi hello yes yeah yep nope sure thanks thank please lol
    aren't can't couldn't didn't doesn't don't hadn't hasn't haven't he'd he'll i'd i'll i'm
    i've isn't it'd it'll let's mustn't shan't she'd she'll shouldn't that'll there'd they'd
    they'll they're they've wasn't we'd we'll we're we've weren't what'll won't wouldn't you'd
    you'll you're you've
    """.split()
)

_TOKEN = re.compile(r"[^\W_]+")
# "WolfgangSchulz" (a chat speaker) and "Wolfgang" (in the question) must meet: split camel case.
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")


def tokenize(text: str, split_camel_case: bool = True) -> list[str]:
    """Lowercase alphanumeric tokens without stopwords; camel-case words also give their parts."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(text):
        word = match.group()
        lowered = word.lower()
        if lowered not in STOPWORDS:
            tokens.append(lowered)
        if split_camel_case and _CAMEL.search(word):
            tokens.extend(p.lower() for p in _CAMEL.split(word) if p.lower() not in STOPWORDS)
    return tokens


def search_terms(text: str) -> str:
    """A chunk's terms, space-separated, for a full-text index that splits on whitespace and nothing else."""
    return " ".join(tokenize(text))
