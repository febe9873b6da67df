"""Reading files into normalised text, document ids and corpus listing."""
import re

import pytest

from lexgraph.ids import content_hash, document_id
from lexgraph.extract.readers import DocumentError, read_document
from lexgraph.inbox import iter_corpus_files
from tests.helpers import write

SAFE_ID = re.compile(r"[a-z0-9._-]+")



# --- read_document: formats ---


def test_markdown_document_text_title_and_metadata(tmp_path):
    raw = "# Fleet Report\n\nThe fleet grew.\n\n## Vessels\n\nTwo joined.\n"
    path = write(tmp_path / "docs" / "fleet report.md", raw)
    doc = read_document(path, root=tmp_path)
    assert doc.text == raw
    assert doc.title == "Fleet Report"
    assert doc.format == "markdown"
    assert doc.relative_path == "docs/fleet report.md"
    assert doc.doc_id == document_id("docs/fleet report.md")
    assert doc.content_hash == content_hash(raw.encode())
    assert doc.size_bytes == len(raw.encode())
    assert doc.uri.startswith("file://") and doc.uri.endswith("/docs/fleet%20report.md")
    assert doc.modified_at.tzinfo is not None


def test_text_document_without_heading_is_titled_by_stem(tmp_path):
    path = write(tmp_path / "email-nowak-2024.txt", "Dear all,\n\nthe engine failed.\n")
    doc = read_document(path)
    assert doc.format == "text"
    assert doc.title == "email-nowak-2024"
    assert doc.text == "Dear all,\n\nthe engine failed.\n"
    assert doc.relative_path == "email-nowak-2024.txt"


def test_title_is_first_heading_even_if_not_on_first_line(tmp_path):
    path = write(tmp_path / "notes.md", "Preamble line\n\n### Deep Title\n\n# Later Title\n")
    assert read_document(path).title == "Deep Title"


def test_title_falls_back_to_stem_when_heading_is_beyond_line_20(tmp_path):
    path = write(tmp_path / "late-heading.md", "line\n" * 25 + "# Too Late\n")
    assert read_document(path).title == "late-heading"


def test_html_drops_script_and_style_and_keeps_headings(tmp_path):
    markup = (
        "<!doctype html><html><head><title>Page title</title>"
        "<style>body { color: red; }</style><script>var secret = 1;</script></head>"
        "<body><h1>Annual   Review</h1><p>Revenue rose &amp; costs fell.</p>"
        "<script>alert('x')</script>"
        "<h2>Fleet <b>changes</b></h2><ul><li>one</li><li>two</li></ul>"
        "<style>.x{}</style><p>Closing text.</p></body></html>"
    )
    path = write(tmp_path / "review.html", markup)
    doc = read_document(path)
    assert doc.format == "html"
    for hidden in ("color: red", "secret", "alert", ".x{}", "Page title", "<"):
        assert hidden not in doc.text, f"{hidden!r} should not be visible text: {doc.text!r}"
    lines = doc.text.splitlines()
    assert "# Annual Review" in lines
    assert "## Fleet changes" in lines
    assert "Revenue rose & costs fell." in lines
    assert lines.index("# Annual Review") < lines.index("## Fleet changes") < lines.index("Closing text.")
    assert doc.title == "Annual Review"
    assert doc.content_hash == content_hash(markup.encode())


def test_html_without_visible_text_is_rejected(tmp_path):
    path = write(tmp_path / "blank.html", "<html><head><script>x()</script></head><body>   </body></html>")
    with pytest.raises(DocumentError, match="no visible text") as info:
        read_document(path)
    assert str(path) in str(info.value)


def test_crlf_and_cr_are_normalised_to_lf(tmp_path):
    path = write(tmp_path / "win.md", b"# Title\r\n\r\nline one\r\nline two\rline three\r\n")
    doc = read_document(path)
    assert "\r" not in doc.text
    assert doc.text == "# Title\n\nline one\nline two\nline three\n"
    assert doc.title == "Title"
    assert doc.size_bytes == len(b"# Title\r\n\r\nline one\r\nline two\rline three\r\n")


def test_utf8_bom_is_stripped(tmp_path):
    path = write(tmp_path / "bom.md", b"\xef\xbb\xbf# Heading\n\nbody\n")
    doc = read_document(path)
    assert not doc.text.startswith("\ufeff")
    assert doc.text == "# Heading\n\nbody\n"
    assert doc.title == "Heading"


def test_text_is_nfc_normalised(tmp_path):
    path = write(tmp_path / "nfd.txt", "A\u030aberg\n")  # decomposed Å
    assert read_document(path).text == "\u00c5berg\n"


# --- read_document: errors name the file ---


@pytest.mark.parametrize(
    "name, data, problem",
    [
        ("empty.md", b"", "file is empty"),
        ("spaces.txt", b"  \n\t\r\n  \n", "only whitespace"),
        ("binary.md", b"# looks like text\x00\x01\x02 but has NUL", "binary"),
        ("latin1.md", b"abc\xff def", "not valid UTF-8 (byte 0xff at offset 3)"),
        ("report.pdf", b"%PDF-1.7 fake", "corrupt or unreadable PDF"),
        ("sheet.xlsx", b"PK\x03\x04 fake", "unsupported file type .xlsx"),
        ("no_suffix", b"plain words", "unsupported file type (none)"),
    ],
)
def test_unreadable_files_raise_document_error_naming_the_file(tmp_path, name, data, problem):
    path = write(tmp_path / name, data)
    with pytest.raises(DocumentError) as info:
        read_document(path)
    message = str(info.value)
    assert str(path) in message, message
    assert problem in message, message
    assert info.value.path == str(path)


def test_removed_file_raises_document_error(tmp_path):
    path = write(tmp_path / "gone.md", "# soon gone\n")
    path.unlink()
    with pytest.raises(DocumentError, match="no longer exists") as info:
        read_document(path)
    assert str(path) in str(info.value)


def test_valid_utf8_multibyte_text_is_accepted(tmp_path):
    path = write(tmp_path / "nordic.md", "# Søren Åberg\n\nØresund – “quoted” ✓\n")
    doc = read_document(path)
    assert doc.title == "Søren Åberg"
    assert "“quoted” ✓" in doc.text


# --- bugs found while writing these tests (fail until lexgraph/sources.py is fixed) ---


def test_invalid_utf8_after_bom_reports_the_real_byte_and_offset(tmp_path):
    raw = b"\xef\xbb\xbfabc\xff def"
    path = write(tmp_path / "bom-latin1.md", raw)
    with pytest.raises(DocumentError) as info:
        read_document(path)
    assert "byte 0xff at offset 6" in str(info.value), (
        "BUG (sources.decode_text): with a BOM, UnicodeDecodeError.start is relative to the bytes after the BOM, "
        f"but is used to index the raw bytes; got {str(info.value)!r}"
    )


@pytest.mark.parametrize("raw", [b"\xef\xbb\xbf", b"\xef\xbb\xbf \n\n", "\u00a0\u3000\n".encode()])
def test_file_with_only_bom_or_unicode_whitespace_is_rejected(tmp_path, raw):
    path = write(tmp_path / "blank.md", raw)
    try:
        doc = read_document(path)
    except DocumentError as error:
        assert str(path) in str(error)
        return
    pytest.fail(
        "BUG (sources.decode_text): emptiness is checked on raw bytes (bytes.strip) before the BOM is removed "
        f"and only for ASCII whitespace, so {raw!r} is accepted with text {doc.text!r}"
    )


def test_html_with_omitted_head_end_tag_keeps_its_body(tmp_path):
    # HTML5 allows omitting </head>; the parser's skip depth for <head> then never returns to 0
    markup = "<html><head><title>T</title><body><h1>Report</h1><p>Body text here.</p></body></html>"
    path = write(tmp_path / "nohead.html", markup)
    doc = read_document(path)
    assert "Body text here." in doc.text and doc.title == "Report", (
        f"BUG (sources._HtmlToMarkdown): body dropped after an unclosed <head>; text {doc.text!r}, title {doc.title!r}"
    )


def test_title_drops_closing_hashes_like_the_chunker(tmp_path):
    path = write(tmp_path / "closed.md", "## Fleet Report ##\n\nbody\n")
    assert read_document(path).title == "Fleet Report", (
        "BUG (sources._title): the optional closing '#' sequence of an ATX heading is kept in the title "
        f"({read_document(path).title!r}), while chunking's heading path drops it"
    )


# --- document_id ---


@pytest.mark.parametrize(
    "relative",
    ["notes.md", "a b.md", "a_b.md", "Søren Åberg: notes.md", "deep/nested/folder/file.txt",
     "Ünïcödé/日本語.md", "C:weird\\back\\slash.md", "-.leading.md", "...", "x" * 300 + ".md"],
)
def test_document_id_is_deterministic_and_safe(relative):
    key = document_id(relative)
    assert key == document_id(relative)
    assert SAFE_ID.fullmatch(key), key
    assert ":" not in key and "/" not in key and "\\" not in key
    assert len(key) <= 80 + 1 + 8


def test_document_id_separates_paths_that_slug_alike():
    ids = {document_id(p) for p in ["a b.md", "a_b.md", "a-b.md", "a:b.md", "A B.md", "a/b.md", "a--b.md",
                                    "Søren.md", "Soren.md", "Sren.md"]}
    assert len(ids) == 10
    assert document_id("a b.md") != document_id("a_b.md")


def test_document_id_is_readable_and_path_sensitive():
    key = document_id("Søren Åberg: notes.md")
    assert key.startswith("sren-aberg-notes.md-"), key
    nested = document_id("contracts/2024/fs-2023.md")
    assert nested.startswith("contracts--2024--fs-2023.md-"), nested
    assert nested != document_id("fs-2023.md")
    assert document_id("contracts\\2024\\fs-2023.md") == nested, "Windows separators give the same id"
    assert document_id("/contracts/2024/fs-2023.md") == nested


def test_read_document_id_matches_document_id_of_relative_path(tmp_path):
    path = write(tmp_path / "sub dir" / "Søren Åberg: notes.md", "# Notes\n\nbody\n")
    doc = read_document(path, root=tmp_path)
    assert doc.relative_path == "sub dir/Søren Åberg: notes.md"
    assert doc.doc_id == document_id("sub dir/Søren Åberg: notes.md")
    assert SAFE_ID.fullmatch(doc.doc_id)


# --- iter_corpus_files ---


def test_iter_corpus_files_is_stable_and_skips_hidden(tmp_path):
    root = tmp_path / "corpus"
    # created out of order on purpose
    for relative in ["z.md", "c/d/e.md", ".hidden.md", ".git/config", "a/.secret.txt", "b.txt", "a/x.md",
                     "a/report.pdf", "c/.cache/blob.md"]:
        write(root / relative, "text\n")
    files = [p.relative_to(root).as_posix() for p in iter_corpus_files(root)]
    # files of a folder in name order, then its sub-folders in name order
    assert files == ["b.txt", "z.md", "a/report.pdf", "a/x.md", "c/d/e.md"]
    assert files == [p.relative_to(root).as_posix() for p in iter_corpus_files(root)]


def test_iter_corpus_files_single_file_root(tmp_path):
    path = write(tmp_path / "only.md", "text\n")
    assert iter_corpus_files(path) == [path]


def test_iter_corpus_files_missing_root_raises(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        iter_corpus_files(missing)


def test_iter_corpus_files_empty_folder(tmp_path):
    assert iter_corpus_files(tmp_path) == []
