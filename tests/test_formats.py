"""PDF, DOCX, PPTX and HTML to normalised Markdown with page numbers, made with the same libraries
that read them; bad files fail alone with a message naming the file."""
import io
import zipfile

import polars as pl
import pytest
from docx import Document
from pptx import Presentation
from pptx.util import Inches
from pypdf import PdfReader, PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from lexgraph.indexing.pipeline import CHUNKS, SOURCES, chunk_frame, load_sources
from lexgraph.extract.readers import DocumentError, probe_problem, read_document
from lexgraph.extract.source_texts import SOURCE_TEXTS, page_of, source_span, source_text
from lexgraph.ids import content_hash, document_id
from lexgraph.query.retrieval_types import Hit
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from tests.helpers import write

OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


# --- making real files ---


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A PDF with a text layer: each page shows its lines in Helvetica."""
    writer = PdfWriter()
    font = writer._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica")}))
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        stream = DecodedStreamObject()
        stream.set_data(("BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({line}) Tj T*" for line in lines) + " ET").encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject({
            NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def encrypted_pdf_bytes(user_password: str = "user-secret") -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes([["Secret terms of contract C-9."]]))))
    writer.encrypt(user_password, "owner-secret", algorithm="AES-256")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def blank_pdf_bytes() -> bytes:
    """A scan without OCR looks like this to a text extractor: pages, no text layer."""
    writer = PdfWriter()
    writer.add_blank_page(612, 792)
    writer.add_blank_page(612, 792)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def docx_bytes() -> bytes:
    document = Document()
    section = document.sections[0]
    section.header.paragraphs[0].text = "CONFIDENTIAL RUNNING HEADER"
    section.footer.paragraphs[0].text = "Footer page marker"
    document.add_heading("Fleet Report", 0)
    document.add_paragraph("The fleet grew in 2023.")
    document.add_heading("Vessels", 1)
    document.add_paragraph("Two vessels joined the register.")
    table = document.add_table(rows=3, cols=3)
    for r, row in enumerate([["Name", "Built", "Tonnage"], ["Nordlys Spirit", "2011", "4200"],
                             ["Kestrel | Dawn", "2015", "5100"]]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.add_heading("Engines", 2)
    document.add_paragraph("Bolt Engines supplied both.")
    document.add_paragraph("first engine check", style="List Bullet")
    document.add_paragraph("second engine check", style="List Bullet")
    document.add_paragraph("# not a heading, just a hash in body text")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def pptx_bytes(first_title: str = "Fleet overview") -> bytes:
    deck = Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])
    first.shapes.title.text = first_title
    first.placeholders[1].text_frame.text = "Nordlys Spirit joined the fleet in March."
    second = deck.slides.add_slide(deck.slide_layouts[5])
    second.shapes.title.text = "Tonnage"
    table = second.shapes.add_table(3, 2, Inches(1), Inches(2), Inches(4), Inches(1.5)).table
    for r, row in enumerate([["Vessel", "Tonnage"], ["Nordlys Spirit", "4200"], ["Kestrel Dawn", "5100"]]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    box = second.shapes.add_textbox(Inches(1), Inches(5), Inches(4), Inches(1))
    box.text_frame.text = "Figures from the 2023 register."
    untitled = deck.slides.add_slide(deck.slide_layouts[6])  # blank layout: no title placeholder
    untitled.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1)).text_frame.text = "Questions welcome."
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def zip_bytes(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def chunks_for(document, embedder, max_tokens: int = 64) -> pl.DataFrame:
    source = {"doc_id": document.doc_id, "text": document.text, "format": document.format,
              "relative_path": document.relative_path, "content_hash": document.content_hash,
              "page_starts": list(document.page_starts)}
    return chunk_frame(source, embedder, max_tokens)


def hit(row: dict) -> Hit:
    return Hit(chunk_id=row["chunk_id"], doc_id=row["doc_id"], score=1.0, text=row["text"],
               char_start=row["char_start"], char_end=row["char_end"], token_count=row["token_count"],
               source_path=row["source_path"], heading_path=row["heading_path"],
               page_start=row["page_start"], page_end=row["page_end"])


# --- PDF ---


PDF_PAGES = [["Fleet report 2023.", "The fleet grew by two vessels."],
             ["Nordlys Spirit was repaired at Fosna.", "The repair took nine days."],
             ["Kestrel Dawn was sold in December.", "The buyer was Alpha Shipping."]]


def test_pdf_text_layer_keeps_pages_and_every_chunk_knows_its_page(tmp_path, embedder):
    path = write(tmp_path / "report.pdf", pdf_bytes(PDF_PAGES))
    document = read_document(path)
    assert document.format == "pdf"
    assert len(document.page_starts) == 3 and document.page_starts[0] == 0
    for number, lines in enumerate(PDF_PAGES, start=1):
        start = document.page_starts[number - 1]
        end = document.page_starts[number] if number < 3 else len(document.text)
        assert all(line in document.text[start:end] for line in lines), (number, document.text[start:end])
    chunks = chunks_for(document, embedder, max_tokens=16)  # small: one chunk per page at most
    assert chunks["page_start"].null_count() == 0 and chunks["page_end"].null_count() == 0
    for row in chunks.iter_rows(named=True):
        assert document.text[row["char_start"]:row["char_end"]] == row["text"]
        expected = next(n for n, lines in enumerate(PDF_PAGES, start=1) if any(line in row["text"] for line in lines))
        assert row["page_start"] == expected, row
    sold = next(r for r in chunks.iter_rows(named=True) if "Kestrel Dawn" in r["text"])
    assert hit(sold).citation == f"report.pdf p. 3 [chars {sold['char_start']}–{sold['char_end']}]"


def test_chunk_spanning_pages_cites_a_page_range(tmp_path, embedder):
    path = write(tmp_path / "short.pdf", pdf_bytes([["Page one line."], ["Page two line."]]))
    document = read_document(path)
    rows = chunks_for(document, embedder, max_tokens=128).to_dicts()
    assert len(rows) == 1 and (rows[0]["page_start"], rows[0]["page_end"]) == (1, 2)
    assert hit(rows[0]).citation.startswith("short.pdf pp. 1–2 [chars 0–")


def test_pdf_locked_only_by_an_owner_password_is_read(tmp_path):
    """Viewers open these without asking: only editing or printing is restricted."""
    document = read_document(write(tmp_path / "restricted.pdf", encrypted_pdf_bytes(user_password="")))
    assert "Secret terms of contract C-9." in document.text and document.page_starts == (0,)


def test_page_of_maps_offsets_to_pages():
    assert page_of([], 5) is None and page_of(None, 5) is None
    starts = [0, 10, 10, 25]  # page 3 is empty: its text belongs to no offset
    assert [page_of(starts, o) for o in (0, 9, 10, 24, 25, 99)] == [1, 1, 3, 3, 4, 4]


# --- DOCX ---


def test_docx_headings_become_the_heading_path_and_tables_stay_tables(tmp_path, embedder):
    path = write(tmp_path / "fleet.docx", docx_bytes())
    document = read_document(path)
    assert document.format == "docx" and document.page_starts == ()
    assert document.title == "Fleet Report"
    text = document.text
    assert "CONFIDENTIAL" not in text and "Footer page marker" not in text
    lines = text.splitlines()
    assert "# Fleet Report" in lines and "# Vessels" in lines and "## Engines" in lines
    assert "| Name | Built | Tonnage |" in lines
    assert "| Nordlys Spirit | 2011 | 4200 |" in lines
    assert "| Kestrel \\| Dawn | 2015 | 5100 |" in lines  # a pipe in a cell cannot break the table
    # document order: the table sits between its section's paragraph and the next heading
    assert text.index("Two vessels joined") < text.index("| Name |") < text.index("## Engines")
    assert "- first engine check\n- second engine check" in text
    chunks = chunks_for(document, embedder, max_tokens=128)
    by_text = {row["text"]: row for row in chunks.iter_rows(named=True)}
    table_chunk = next(r for t, r in by_text.items() if "| Name | Built" in t)
    assert table_chunk["heading_path"] == "Vessels"
    assert table_chunk["page_start"] is None
    engines = next(r for t, r in by_text.items() if "Bolt Engines" in t)
    assert engines["heading_path"] == "Vessels > Engines"
    hashed = next(r for t, r in by_text.items() if "not a heading" in t)
    assert hashed["heading_path"] == "Vessels > Engines", "a '#' typed in body text must not become a heading"


# --- PPTX ---


def test_pptx_slides_are_pages_with_their_titles_as_headings(tmp_path, embedder):
    path = write(tmp_path / "deck.pptx", pptx_bytes())
    document = read_document(path)
    assert document.format == "pptx"
    assert len(document.page_starts) == 3
    text = document.text
    assert text[document.page_starts[0]:].startswith("# Fleet overview")
    assert text[document.page_starts[1]:].startswith("# Tonnage")
    assert text[document.page_starts[2]:].startswith("# Slide 3")
    assert "| Vessel | Tonnage |\n| --- | --- |\n| Nordlys Spirit | 4200 |" in text
    # reading order: the table (higher on the slide) before the text box below it
    assert text.index("| Vessel |") < text.index("Figures from the 2023 register.")
    chunks = chunks_for(document, embedder, max_tokens=128)
    pages = {row["heading_path"]: (row["page_start"], row["page_end"]) for row in chunks.iter_rows(named=True)}
    assert pages == {"Fleet overview": (1, 1), "Tonnage": (2, 2), "Slide 3": (3, 3)}
    tonnage = next(r for r in chunks.iter_rows(named=True) if r["heading_path"] == "Tonnage")
    assert "| Kestrel Dawn | 5100 |" in tonnage["text"], "a table that fits stays whole in one chunk"
    assert hit(tonnage).citation.startswith("deck.pptx p. 2 [chars ")


# --- HTML ---


def test_html_tables_keep_cells_apart_and_pre_keeps_its_lines(tmp_path):
    markup = ("<html><body><h1>Vessels</h1><table><tr><th>Name</th><th>Built</th></tr>"
              "<tr><td>Nordlys</td><td>2011</td></tr></table>"
              "<pre>def check(engine):\n    return engine.hours &lt; 20000\n\n\nprint(check)</pre>"
              "<p>After the code.</p></body></html>")
    document = read_document(write(tmp_path / "page.html", markup))
    assert "NameBuilt" not in document.text and "Nordlys2011" not in document.text
    assert "| Name | Built |\n| --- | --- |\n| Nordlys | 2011 |" in document.text
    assert "```\ndef check(engine):\n    return engine.hours < 20000\n\n\nprint(check)\n```" in document.text


# --- bad files fail alone, naming the file ---


@pytest.mark.parametrize("name, data, problem", [
    ("locked.pdf", encrypted_pdf_bytes(), "encrypted; "),
    ("scan.pdf", blank_pdf_bytes(), "no text layer; OCR is not configured"),
    ("broken.pdf", b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\ngarbage without xref", "corrupt or unreadable PDF"),
    ("notpdf.pdf", b"just some words", "not a PDF file"),
    ("broken.docx", zip_bytes({"hello.txt": "not a word document"}), "corrupt or unreadable DOCX"),
    ("truncated.docx", docx_bytes()[:300], "corrupt or unreadable DOCX"),
    ("locked.docx", OLE_SIGNATURE + b"\x00" * 504, "password-protected or legacy Word file"),
    ("broken.pptx", zip_bytes({"[Content_Types].xml": "<Types/>"}), "corrupt or unreadable PPTX"),
    ("text.pptx", b"slide one\nslide two\n", "not a .pptx file (not a zip archive)"),
    ("empty.docx", b"", "file is empty"),
])
def test_bad_office_files_raise_document_error_naming_the_file(tmp_path, name, data, problem):
    path = write(tmp_path / name, data)
    with pytest.raises(DocumentError) as info:
        read_document(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and problem in message, message


@pytest.mark.parametrize("name, data, problem", [
    ("report.pdf", pdf_bytes([["fine"]]), None),
    ("deck.pptx", pptx_bytes(), None),
    ("notes.md", b"# fine\n", None),
    ("locked.docx", OLE_SIGNATURE + b"\x00" * 504, "password-protected or legacy Word file"),
    ("photo.pdf", b"\x89PNG\r\n\x1a\n", "not a PDF file"),
    ("binary.md", b"\x00\x01", "binary"),
    ("sheet.xlsx", b"PK\x03\x04", "unsupported file type .xlsx"),
])
def test_probe_checks_signatures_cheaply(tmp_path, name, data, problem):
    path = write(tmp_path / name, data)
    found = probe_problem(path, data)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(f"{path}: ") and problem in found, found


# --- every source version's text is kept ---


def test_old_version_text_remains_readable_after_the_file_changes(tmp_path, embedder):
    root = tmp_path / "inbox"
    path = write(root / "deck.pptx", pptx_bytes())
    store = ExtractStore(tmp_path / "extract")
    doc_id = document_id("deck.pptx")
    assert load_sources({doc_id: path}, root, store, "v1").done == [doc_id]
    old = store.read(SOURCES, doc_id).row(0, named=True)
    assert old["page_starts"] == [0, old["page_starts"][1], old["page_starts"][2]]
    old_chunks = chunk_frame(old, embedder, 64)

    write(path, pptx_bytes(first_title="Fleet overview, revised"))  # the file changes in place
    assert load_sources({doc_id: path}, root, store, "v1").done == [doc_id]
    new = store.read(SOURCES, doc_id).row(0, named=True)
    assert new["content_hash"] != old["content_hash"] and "Fleet overview, revised" in new["text"]

    for row in old_chunks.iter_rows(named=True):
        assert source_span(store, old["content_hash"], row["char_start"], row["char_end"]) == row["text"]
    assert source_text(store, old["content_hash"])["page_starts"] == old["page_starts"]
    assert "# Fleet overview\n" in source_text(store, old["content_hash"])["text"]
    assert sorted(store.doc_ids(SOURCE_TEXTS)) == sorted([old["content_hash"], new["content_hash"]])
    with pytest.raises(ValueError, match="outside"):
        source_span(store, old["content_hash"], 0, len(old["text"]) + 1)
    with pytest.raises(KeyError):
        source_span(store, content_hash(b"never stored"), 0, 1)


# --- end to end through Dagster ---


def test_folder_of_every_format_indexes_good_files_and_reports_bad_ones(tmp_path, instance):
    folder = tmp_path / "inbox"
    good = {
        "report.pdf": pdf_bytes(PDF_PAGES),
        "fleet.docx": docx_bytes(),
        "deck.pptx": pptx_bytes(),
        "page.html": "<h1>Fleet</h1><table><tr><th>Name</th><th>Built</th></tr><tr><td>Fosna</td><td>1999</td></tr></table>",
        "notes.md": "Notes\n=====\n\nThe fleet grew.\n",
        "memo.txt": "Bolt Engines supplied both engines.\n",
    }
    bad = {
        "locked.pdf": (encrypted_pdf_bytes(), "encrypted"),
        "scan.pdf": (blank_pdf_bytes(), "no text layer"),
        "broken.pdf": (b"%PDF-1.4\ngarbage", "corrupt or unreadable PDF"),
        "locked.docx": (OLE_SIGNATURE + b"\x00" * 504, "password-protected"),
        "broken.docx": (zip_bytes({"a.txt": "x"}), "corrupt or unreadable DOCX"),
        "broken.pptx": (b"PK\x03\x04 truncated", "corrupt or unreadable PPTX"),
    }
    for name, data in good.items():
        write(folder / name, data)
    for name, (data, _) in bad.items():
        write(folder / name, data)
    home = tmp_path / "index"

    from orchestration.runner import ingest_folder

    report = ingest_folder(folder, instance, home=home, progress=False)

    vectors = VectorStore(Settings.from_env(home=home).lance_uri)
    assert sorted(vectors.sources()["relative_path"].to_list()) == sorted(good)
    assert sorted(report.failed) == sorted(document_id(name) for name in bad)
    for name, (_, problem) in bad.items():
        message = report.failed[document_id(name)]
        assert name in message and problem in message, message
    chunks = pl.from_arrow(vectors.db.open_table("chunks").to_arrow().drop(["vector"]))
    pdf = chunks.filter(pl.col("source_path") == "report.pdf")
    assert pdf.height and pdf["page_start"].null_count() == 0
    assert set(chunks.filter(pl.col("source_path") == "deck.pptx")["page_start"].to_list()) == {1, 2, 3}
    assert chunks.filter(pl.col("source_path") == "notes.md")["heading_path"].to_list() == ["Notes"]
    assert chunks.filter(pl.col("source_path") == "fleet.docx")["page_start"].null_count() > 0
    graph = GraphStore(Settings.from_env(home=home).graph_path)
    try:
        pages = graph.query("MATCH (c:Chunk)-[:PART_OF]->(s:Source) WHERE s.relative_path = $p "
                            "RETURN c.page_start AS page ORDER BY c.ord", {"p": "deck.pptx"})["page"].to_list()
    finally:
        graph.close()
    assert pages == sorted(pages) and set(pages) == {1, 2, 3}
    store = ExtractStore(Settings.from_env(home=home).extract_dir)
    for row in chunks.iter_rows(named=True):
        assert source_span(store, row["content_hash"], row["char_start"], row["char_end"]) == row["text"]
    assert store.exists(CHUNKS, document_id("report.pdf"))


def test_source_nodes_record_format_and_pages(tmp_path, home, instance):
    """DESIGN §3: the Source node carries the format and, where the format has pages, how many."""
    from lexgraph.storage.graph_store import GraphStore
    from orchestration.runner import ingest_folder

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "deck.pptx").write_bytes(pptx_bytes())  # three slides
    (inbox / "notes.md").write_text("# Notes\n\nPlain Markdown has no pages.\n")
    assert ingest_folder(inbox, instance, home=home, progress=False).failed == {}
    graph = GraphStore(Settings.from_env(home=home).graph_path)
    try:
        rows = graph.query("MATCH (s:Source) RETURN s.relative_path AS path, s.format AS format, s.pages AS pages")
    finally:
        graph.close()
    assert sorted(rows.iter_rows()) == [("deck.pptx", "pptx", 3), ("notes.md", "markdown", None)]
