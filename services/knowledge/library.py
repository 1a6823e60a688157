"""The searchable documents of a deployment's agents: built once at start, searched before a turn's first model call."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import tantivy

from crashsafe.contracts.run_events import Passage

# Below this BM25 score a section shares too little with the question to be worth the model's attention.
MIN_SCORE = 2.5
# And a section far behind the best one is noise beside it.
RELATIVE_FLOOR = 0.35
# Words that carry no topic: a question's "what is the … ?" must not match every section.
_STOP = """a about after am an and any are as at be been before being but by can could do does for from had has
    have how i if in into is it its me my no not of on or our please so than that the their them then there
    these they this to up us was we were what when where which who why will with would you your yours tell
    know want need"""
STOPWORDS = frozenset(_STOP.split())
_WORD = re.compile(r"[a-z0-9]+")
_HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")


@dataclass(frozen=True, slots=True)
class Section:
    """One searchable piece: a document's `##` section (its title is the document's `#` heading)."""

    doc: str
    section: str
    text: str


def sections(doc: str, markdown: str) -> list[Section]:
    """Split a markdown document by heading: each heading below the title starts a section; the title names
    the document, and text before the first section heading is a section named after the title."""
    title, heading = doc, ""
    lines: list[str] = []
    found: list[Section] = []

    def close() -> None:
        body = "\n".join(lines).strip()
        if body:
            found.append(Section(doc=title, section=heading or title, text=" ".join(body.split())))

    for line in markdown.splitlines():
        match = _HEADING.match(line)
        if match is None:
            lines.append(line)
            continue
        close()
        lines = []
        if len(match.group(1)) == 1 and not found and not heading:
            title = match.group(2)
        else:
            heading = match.group(2)
    close()
    return found


# A guest's message is bounded by the gateway, but a search needs no more than its first topic words.
MAX_TERMS = 64


def _terms(text: str) -> list[str]:
    """The topic words of `text`, lower-cased, each once, in order: only letters and digits ever reach the query
    parser, so no guest text is read as query syntax (fields, ranges, boolean operators)."""
    words = dict.fromkeys(w for w in _WORD.findall(text.lower()) if w not in STOPWORDS)
    return list(words)[:MAX_TERMS]


class Library:
    """Sections of markdown documents in an in-memory tantivy index (BM25 over English-stemmed words). Built once;
    the same question gives the same passages in the same order for the life of the process and across
    restarts with the same documents (one segment, written in document order)."""

    def __init__(self, documents: Iterable[tuple[str, str]] = (), problem: str = "") -> None:
        """`documents`: (name, markdown) pairs. `problem`: why the deployment's documents could not be loaded
        (the degraded mode: the library finds nothing, and the runtime hands policy questions to a person)."""
        self.problem = problem
        self.sections = [s for name, text in documents for s in sections(name, text)]
        builder = tantivy.SchemaBuilder()
        builder.add_text_field("title", stored=False, tokenizer_name="en_stem")
        builder.add_text_field("section", stored=False, tokenizer_name="en_stem")
        builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
        builder.add_integer_field("n", stored=True, indexed=False)
        self._index = tantivy.Index(builder.build())
        writer = self._index.writer(heap_size=15_000_000, num_threads=1)
        for n, section in enumerate(self.sections):
            writer.add_document(
                tantivy.Document(title=section.doc, section=section.section, body=section.text, n=n)
            )
        writer.commit()
        writer.wait_merging_threads()
        self._index.reload()

    @property
    def available(self) -> bool:
        """False in the degraded mode: the documents are missing or failed to load."""
        return not self.problem

    @classmethod
    def stayhub(cls, folder: Path | None = None) -> Library:
        """StayHub's policy and FAQ documents: those shipped in this package (services/knowledge/stayhub/*.md),
        or the `*.md` files of `folder` (CRASHSAFE_KNOWLEDGE_DIR). Never raises: a folder that is missing, holds
        no document or cannot be read gives an empty library that says why (`problem`), so the runtime starts
        and answers what needs no policy."""
        where: Traversable = (
            folder if folder is not None else resources.files("crashsafe.services.knowledge") / "stayhub"
        )
        try:
            documents = sorted(
                (entry.name.removesuffix(".md"), entry.read_text(encoding="utf-8"))
                for entry in where.iterdir()
                if entry.name.endswith(".md") and entry.is_file()
            )
        except (OSError, UnicodeDecodeError) as exc:
            return cls(problem=f"policy documents at {where} could not be read: {exc}"[:300])
        if not documents:
            return cls(problem=f"no policy documents (*.md) at {where}"[:300])
        return cls(documents)

    def search(self, query: str, limit: int = 3) -> list[Passage]:
        """The sections that best answer `query`, best first (ties in document order); nothing for a question
        that shares no topic word with any section."""
        terms = _terms(query)
        if not terms or not self.sections or limit < 1:
            return []
        parsed = self._index.parse_query(
            " ".join(terms), ["title", "section", "body"], field_boosts={"section": 2.0}
        )
        searcher = self._index.searcher()
        hits = []
        for score, address in searcher.search(parsed, limit=max(limit * 4, 12)).hits:
            n = int(searcher.doc(address)["n"][0])
            hits.append((round(float(score), 4), n))
        hits.sort(key=lambda hit: (-hit[0], hit[1]))
        if not hits or hits[0][0] < MIN_SCORE:
            return []
        floor = max(MIN_SCORE, hits[0][0] * RELATIVE_FLOOR)
        return [
            Passage(
                doc=self.sections[n].doc,
                section=self.sections[n].section,
                text=self.sections[n].text,
                score=score,
            )
            for score, n in hits[:limit]
            if score >= floor
        ]
