"""Unit records (experiments/records.py): a record of another configuration is never replaced silently."""

from __future__ import annotations

import pytest

from originlens.errors import InputError
from originlens.experiments.records import check_record_slot, read_unit_record, record_path, write_unit_record


def _write(path, steps, value):
    return write_unit_record(
        path,
        experiment="othello",
        name="othello-cpu",
        unit="seed-0",
        config_key={"settings": {"steps": steps}},
        values={"acc": value},
        command="originlens ntp experiment othello",
    )


def test_a_record_of_another_configuration_is_not_replaced(tmp_path):
    path = record_path(tmp_path / "othello" / "othello-cpu.json", "seed-0")
    assert path == tmp_path / "othello" / "othello-cpu" / "seed-0.json"
    _write(path, 12000, 0.95)
    before = path.read_bytes()
    with pytest.raises(InputError, match="another configuration") as exc:
        _write(path, 12, 0.1)  # a short trial of the same scale name
    assert "--results" in exc.value.fix
    assert path.read_bytes() == before
    with pytest.raises(InputError):
        check_record_slot(path, unit="seed-0", config_key={"settings": {"steps": 12}})
    check_record_slot(path, unit="seed-0", config_key={"settings": {"steps": 12000}})  # same configuration: fine
    _write(path, 12000, 0.96)  # a rerun of the same configuration replaces its own record
    rec = read_unit_record(path, experiment="othello", unit="seed-0", config_key={"settings": {"steps": 12000}})
    assert rec["values"] == {"acc": 0.96}
    check_record_slot(tmp_path / "absent.json", unit="seed-0", config_key={})
