"""The short path's entry tables: a program of ever new shapes cannot grow them without end."""
from neural_arch.distributed.transports import short_entries
from neural_arch.distributed.transports.short_entries import EntryTables


def test_a_full_table_starts_afresh_and_the_others_keep_theirs(monkeypatch):
    monkeypatch.setattr(short_entries, "MAX_ENTRIES", 3)
    tables = EntryTables()
    tables.broadcast["kept"] = "entry"
    for shape in range(3):
        tables.make_room(tables.all_reduce)
        tables.all_reduce[shape] = "entry"
    assert len(tables.all_reduce) == 3
    tables.make_room(tables.all_reduce)
    assert tables.all_reduce == {} and tables.broadcast == {"kept": "entry"}
    tables.clear()
    assert (tables.all_reduce, tables.broadcast, tables.barrier) == ({}, {}, None)
