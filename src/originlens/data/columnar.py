"""Column-oriented corpus files for :mod:`.readers`: Parquet, Arrow, and ``datasets`` directories.

* Parquet (``.parquet``): record batches of one string column;
* Arrow (``.arrow``): the IPC stream format that ``datasets`` writes (the IPC file format is read too);
* a directory written by ``datasets.Dataset.save_to_disk`` (``state.json`` + ``dataset_info.json`` +
  ``data-*.arrow``) stands for its Arrow shards in the order ``state.json`` lists them; one written by
  ``DatasetDict.save_to_disk`` (``dataset_dict.json`` + one directory per split) is refused with a line
  naming its splits.

The column is ``text_field`` if given, else ``text``, else ``story``; it must hold strings.  Everything
is read with ``pyarrow`` (no ``datasets`` needed), batch by batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError

DEFAULT_FIELDS = ("text", "story")
DATASET_STATE = "state.json"
DATASET_INFO = "dataset_info.json"
DATASET_DICT = "dataset_dict.json"


def _text_column(schema: Any, path: Path, text_field: str | None) -> str:
    import pyarrow as pa

    names = list(schema.names)
    wanted = (text_field,) if text_field else DEFAULT_FIELDS
    col = next((n for n in wanted if n in names), None)
    if col is None:
        want = repr(text_field) if text_field else "'text' or 'story'"
        raise InputError(
            f"{path} has no column {want} (columns: {', '.join(names[:10])})",
            "pass --text-field (text_field=) naming the text column",
        )
    typ = schema.field(col).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise InputError(
            f"{path}: column {col!r} has type {typ}, not string", "pass --text-field naming a string column"
        )
    return col


def iter_parquet(path: Path, text_field: str | None) -> Iterator[str | None]:
    """The strings of the text column of a Parquet file (``None`` for nulls)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path} is not a readable Parquet file ({exc})", "check the file") from None
    col = _text_column(pf.schema_arrow, path, text_field)
    try:
        for batch in pf.iter_batches(batch_size=1024, columns=[col]):
            yield from batch.column(0).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read {path} ({exc})", "check that the file is complete") from None


def iter_arrow(path: Path, text_field: str | None) -> Iterator[str | None]:
    """The strings of the text column of an Arrow IPC stream (as ``datasets`` writes) or IPC file."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        f = pa.memory_map(str(path), "r")
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read {path}: {exc}", "check the path and permissions") from None
    with f:
        try:
            reader: Any = ipc.open_stream(f)
        except pa.ArrowInvalid:
            try:
                f.seek(0)
                reader = ipc.open_file(f)
            except pa.ArrowInvalid:
                raise InputError(
                    f"{path} is not an Arrow IPC file", "pass the .arrow files written by datasets' save_to_disk"
                ) from None
        col = _text_column(reader.schema, path, text_field)
        batches = reader if isinstance(reader, ipc.RecordBatchStreamReader) else _file_batches(reader)
        try:
            for batch in batches:
                yield from batch.column(col).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot read {path} ({exc})", "check that the file is complete") from None


def _file_batches(reader: Any) -> Iterator[Any]:
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


def is_saved_dataset(path: Path) -> bool:
    """A directory written by ``datasets.Dataset.save_to_disk``."""
    return path.is_dir() and (path / DATASET_STATE).is_file() and (path / DATASET_INFO).is_file()


def saved_dataset_files(path: Path) -> list[Path]:
    """The Arrow shards of a ``save_to_disk`` directory, in ``state.json``'s order."""
    try:
        state = json.loads((path / DATASET_STATE).read_text(encoding="utf-8"))
        files = [path / str(entry["filename"]) for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{path / DATASET_STATE} could not be read ({type(exc).__name__}: {exc})",
            "pass a directory written by datasets' Dataset.save_to_disk",
        ) from None
    missing = [f.name for f in files if not f.is_file()]
    if missing or not files:
        raise InputError(
            f"{path} lists Arrow shards that are missing ({', '.join(missing[:3]) or 'none listed'})",
            "save the dataset again with Dataset.save_to_disk",
        )
    return files


def refuse_dataset_dict(path: Path) -> None:
    """:class:`InputError` when ``path`` is a ``DatasetDict.save_to_disk`` directory (one per split)."""
    if not (path.is_dir() and (path / DATASET_DICT).is_file()):
        return
    try:
        splits = [str(s) for s in json.loads((path / DATASET_DICT).read_text(encoding="utf-8"))["splits"]]
    except (OSError, ValueError, KeyError, TypeError):
        splits = sorted(p.name for p in path.iterdir() if is_saved_dataset(p))
    first = splits[0] if splits else "train"
    raise InputError(
        f"{path} holds a datasets DatasetDict (splits: {', '.join(splits) or 'none'}), not one dataset",
        f"pass one split's directory, e.g. {path / first}",
    )
