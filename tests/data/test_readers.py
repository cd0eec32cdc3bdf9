"""Readers: every format, splitting modes, chunk borders, directories, encoding errors, hf: errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from originlens.data import readers
from originlens.data.readers import iter_documents, source_fingerprint
from originlens.errors import ConfigError, InputError, OriginlensError


def docs(*a, **k):
    return list(iter_documents(*a, **k))


# ------------------------------------------------------------------------------------------ plain text


def test_text_one_document_per_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"first story.\r\n\n   \nsecond story\nthird\n")
    assert docs(f) == ["first story.", "second story", "third"]
    assert docs(str(f), split_mode="line") == ["first story.", "second story", "third"]


def test_text_blank_line_separated(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("para one\nstill one\n\n\npara two\n \nthree")
    assert docs(f, split_mode="blank") == ["para one\nstill one", "para two", "three"]


def test_text_eot_split_and_auto_detection(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("Story A\nline 2<|endoftext|>Story B<|endoftext|>\n  <|endoftext|>Story C\n")
    expected = ["Story A\nline 2", "Story B", "Story C"]
    assert docs(f, split_mode="eot") == expected
    assert docs(f) == expected  # auto: marker present in the first MiB


def test_auto_is_line_when_marker_only_after_first_mib(tmp_path, monkeypatch):
    f = tmp_path / "a.txt"
    f.write_text("a b c d e f g h i j k l m n o p\nq<|endoftext|>r\n")
    monkeypatch.setattr(readers, "_CHUNK", 8)  # "first MiB" shrunk to 8 bytes (+ marker length)
    assert docs(f) == ["a b c d e f g h i j k l m n o p", "q<|endoftext|>r"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 64])
def test_chunk_borders_do_not_change_results(tmp_path, monkeypatch, chunk):
    eot = tmp_path / "e.txt"
    eot.write_text("café ☃ one<|endoftext|>deux\nzwei<|endoftext|><|endoftext|>drei 🐟")
    lines = tmp_path / "l.txt"
    lines.write_text("ünï\ncödé ☃\n\nlast")
    js = tmp_path / "j.json"
    js.write_text(json.dumps([{"text": "é1 ☃"}, "plain", {"story": "s", "n": 12345}, {"text": "x" * 50}]))
    expected = [docs(eot), docs(lines), docs(js)]
    monkeypatch.setattr(readers, "_CHUNK", chunk)
    assert [docs(eot, split_mode="eot"), docs(lines), docs(js)] == expected
    assert expected[0] == ["café ☃ one", "deux\nzwei", "drei 🐟"]
    assert expected[2] == ["é1 ☃", "plain", "s", "x" * 50]


def test_gzip_text(tmp_path):
    f = tmp_path / "a.txt.gz"
    with gzip.open(f, "wt", encoding="utf-8") as g:
        g.write("one\ntwo\n")
    assert docs(f) == ["one", "two"]


def test_bom_is_stripped(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes("\ufeffhello\nworld\n".encode("utf-8"))
    assert docs(f) == ["hello", "world"]


# ------------------------------------------------------------------------------------------ JSON


def test_json_list_of_objects_and_strings(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps([{"text": "t1", "id": 1}, {"story": "s2"}, "plain", {"text": None}, {"text": " "}]))
    assert docs(f) == ["t1", "s2", "plain"]


def test_json_text_field_option(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps([{"body": "b1", "text": "no"}, {"body": "b2"}]))
    assert docs(f, text_field="body") == ["b1", "b2"]


def test_json_lines_saved_as_json(tmp_path):
    f = tmp_path / "a.json"
    f.write_text('{"text": "one"}\n{"text": "two"}\n')
    assert docs(f) == ["one", "two"]


def test_jsonl(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text('{"story": "one"}\n\n{"story": "two", "x": [1, 2]}\n')
    assert docs(f) == ["one", "two"]


@pytest.mark.parametrize(
    "content,needle",
    [
        ('[{"text": "a"}, {"text": "b"', "not valid JSON (Expecting ',' delimiter near element 1)"),
        ('[{"text": "a"}', "unterminated list"),
        ('[{"text": "a"} {"text": "b"}]', "expected ','"),
        ("[1, 2]", "element 0 is a int"),
        ('[{"body": "a"}]', "no field 'text' or 'story' (fields: 'body')"),
        ('[{"text": 3}]', "field 'text' is a int"),
        ('"just a string"', "starts with"),
    ],
)
def test_json_errors_name_the_problem(tmp_path, content, needle):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(InputError) as e:
        docs(f)
    assert needle in str(e.value) and "bad.json" in str(e.value)


def test_jsonl_error_names_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(InputError, match="line 2 is not valid JSON"):
        docs(f)


# ------------------------------------------------------------------------------------------ Parquet


def _parquet(path, **cols):
    pq.write_table(pa.table(cols), path, row_group_size=700)


def test_parquet_default_and_custom_column(tmp_path):
    f = tmp_path / "a.parquet"
    stories = [f"story number {i}" for i in range(2500)]  # several batches and row groups
    _parquet(f, story=stories, other=[str(i) for i in range(2500)])
    assert docs(f) == stories
    assert docs(f, text_field="other")[:3] == ["0", "1", "2"]


def test_parquet_errors(tmp_path):
    f = tmp_path / "a.parquet"
    _parquet(f, body=["x"], n=[1])
    with pytest.raises(InputError, match="no column 'text' or 'story'.*body"):
        docs(f)
    with pytest.raises(InputError, match="not string"):
        docs(f, text_field="n")
    g = tmp_path / "broken.parquet"
    g.write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="not a readable Parquet"):
        docs(g)


# ------------------------------------------------------------------------------------------ directories


def test_directory_recursive_sorted_and_filtered(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("b/z\n")
    (tmp_path / "a.jsonl").write_text('{"text": "a.jsonl"}\n')
    (tmp_path / "c.txt").write_text("c\n")
    (tmp_path / "README.md").write_text("not a corpus file\n")
    (tmp_path / ".hidden.txt").write_text("hidden\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.txt").write_text("hidden dir\n")
    _parquet(tmp_path / "b" / "a.parquet", text=["b/a"])
    assert docs(tmp_path) == ["a.jsonl", "b/a", "b/z", "c"]


def test_directory_skips_nested_corpus_dirs(tmp_path):
    (tmp_path / "s.txt").write_text("story\n")
    c = tmp_path / "corpus"
    c.mkdir()
    (c / "manifest.json").write_text(json.dumps({"kind": "originlens.corpus"}))
    (c / "vocab.json").write_text(json.dumps(["the", "a"]))
    assert docs(tmp_path) == ["story"]


def test_empty_directory_and_several_sources(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no corpus files"):
        iter_documents(tmp_path / "empty")
    (tmp_path / "x.txt").write_text("x\n")
    (tmp_path / "y.txt").write_text("y\n")
    assert docs([tmp_path / "y.txt", str(tmp_path / "x.txt")]) == ["y", "x"]


# ------------------------------------------------------------------------------------------ errors


def test_missing_path_raises_at_call_time(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        iter_documents(tmp_path / "nope.txt")  # no iteration needed


def test_non_utf8_reports_file_and_byte_offset(tmp_path, monkeypatch):
    data = "line one ☃\nsecond ".encode() + b"\xff\xfe" + b" tail\n"
    f = tmp_path / "latin.txt"
    f.write_bytes(data)
    offset = data.index(b"\xff")
    for chunk in (1 << 20, 3):
        monkeypatch.setattr(readers, "_CHUNK", chunk)
        with pytest.raises(InputError) as e:
            docs(f)
        assert "latin.txt" in str(e.value) and f"byte offset {offset}" in str(e.value)
        assert "--encoding-errors replace" in str(e.value)
    assert docs(f, errors="replace") == ["line one ☃", "second \ufffd\ufffd tail"]


def test_truncated_utf8_at_end_of_file(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes("ok ☃".encode()[:-1])
    with pytest.raises(InputError, match="byte offset 3"):
        docs(f)


def test_empty_corpus(tmp_path):
    f = tmp_path / "blank.txt"
    f.write_text("\n   \n\t\n")
    with pytest.raises(InputError, match="empty corpus"):
        docs(f)
    g = tmp_path / "empty.json"
    g.write_text("[]")
    with pytest.raises(InputError, match="empty corpus"):
        docs(g)


def test_bad_options(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x\n")
    with pytest.raises(ConfigError):
        iter_documents(f, split_mode="paragraph")
    with pytest.raises(ConfigError):
        iter_documents(f, errors="ignore")


# ------------------------------------------------------------------------------------------ Hugging Face


def test_hf_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(InputError) as e:
        docs("hf:roneneldan/TinyStories")
    msg = str(e.value)
    assert "'datasets'" in msg and "not installed" in msg and "download" in msg and "directory" in msg


def test_hf_offline_error(monkeypatch):
    fake = types.ModuleType("datasets")

    def load_dataset(name, split=None, streaming=False):
        assert streaming is True
        raise ConnectionError("Couldn't reach 'roneneldan/TinyStories' on the Hub (LocalEntryNotFoundError)")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(InputError) as e:
        docs("hf:roneneldan/TinyStories:validation")
    msg = str(e.value)
    assert "'validation'" in msg and "ConnectionError" in msg and "offline" in msg and "download" in msg


def test_hf_streaming_rows(monkeypatch):
    fake = types.ModuleType("datasets")
    seen = {}

    def load_dataset(name, split=None, streaming=False):
        seen.update(name=name, split=split, streaming=streaming)
        return [{"text": "row one"}, {"text": "row two"}]

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert docs("hf:org/name") == ["row one", "row two"]
    assert seen == {"name": "org/name", "split": "train", "streaming": True}


def test_hf_bad_spec():
    with pytest.raises(ConfigError):
        iter_documents("hf:")


# ------------------------------------------------------------------------------------------ fingerprints


def test_source_fingerprint(tmp_path):
    (tmp_path / "d").mkdir()
    a = tmp_path / "d" / "a.txt"
    b = tmp_path / "d" / "b.jsonl"
    a.write_bytes(b"alpha\n")
    b.write_bytes(b'{"text": "beta"}\n')
    fp = source_fingerprint([tmp_path / "d", "hf:org/x:test"])
    assert [x["path"] for x in fp] == [str(a), str(b), "hf:org/x:test"]
    assert fp[0]["bytes"] == 6 and fp[0]["sha256"] == hashlib.sha256(b"alpha\n").hexdigest()
    assert fp[1]["sha256"] == hashlib.sha256(b'{"text": "beta"}\n').hexdigest()
    assert fp[2]["bytes"] is None
    with pytest.raises(OriginlensError):
        source_fingerprint(tmp_path / "missing")


def _save_to_disk_layout(root, texts, shards=2):
    """A directory shaped like ``datasets.Dataset.save_to_disk`` output (Arrow IPC streams + state.json)."""
    root.mkdir()
    files = []
    per = -(-len(texts) // shards)
    for i in range(shards):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        part = texts[i * per : (i + 1) * per]
        table = pa.table({"id": list(range(len(part))), "text": part})
        with pa.OSFile(str(root / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        files.append({"filename": name})
    (root / "state.json").write_text(json.dumps({"_data_files": files[::-1], "_split": "train"}))
    (root / "dataset_info.json").write_text(json.dumps({"citation": "", "features": {}}))
    return root


def test_arrow_files_and_save_to_disk_directories_are_read_not_decoded_as_text(tmp_path):
    """datasets' save_to_disk directory: its shards in state.json's order (never its JSON metadata); a bare
    .arrow file: its text column; a DatasetDict directory: refused naming its splits; other binary
    files: refused as binary, without suggesting --encoding-errors replace."""
    saved = _save_to_disk_layout(tmp_path / "ds", ["a b", "c d", "e f"])
    assert list(iter_documents(saved)) == ["e f", "a b", "c d"]  # state.json lists shard 1 first
    assert list(iter_documents(saved / "data-00000-of-00002.arrow")) == ["a b", "c d"]
    (tmp_path / "outer").mkdir()
    _save_to_disk_layout(tmp_path / "outer" / "nested", ["x y"], shards=1)
    assert list(iter_documents(tmp_path / "outer")) == ["x y"]
    with pytest.raises(InputError, match="no column 'body'"):
        list(iter_documents(saved, text_field="body"))
    dd = tmp_path / "dd"
    _save_to_disk_layout(dd.mkdir() or dd / "train", ["t"], shards=1)
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(InputError, match="DatasetDict.*dd/train"):
        iter_documents(dd)
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"\x00\x01\xff\xfe" * 64)
    with pytest.raises(InputError, match="binary") as exc:
        list(iter_documents(blob))
    assert "encoding-errors" not in str(exc.value)
    datasets = pytest.importorskip("datasets")
    real = tmp_path / "real"
    datasets.Dataset.from_dict({"text": ["one doc", "two doc"], "n": [1, 2]}).save_to_disk(str(real))
    assert list(iter_documents(real)) == ["one doc", "two doc"]
