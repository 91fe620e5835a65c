"""Exact JSON of row values: money, milliseconds and NULLs survive the store unchanged."""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from oncewatch.core.exact_json import flat_json, from_json, to_json
from oncewatch.core.records import BinlogPosition, Packed, RowChange, Transaction

values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(),
    st.decimals(allow_nan=False, allow_infinity=False, places=4),
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1)),
    st.dates(), st.binary(max_size=32),
)


# Keys starting with "$" are reserved for the type tags (oncewatch.core.records.to_json).
@settings(deadline=None)  # make test runs it beside the integration tests: a slow example is no failure
@given(st.dictionaries(st.text(min_size=1).filter(lambda k: not k.startswith("$")), values))
def test_row_values_round_trip_exactly(row):
    back = from_json(to_json(row))
    assert back == row
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in row.items()}


flat_values = st.one_of(values, st.floats(), st.integers(min_value=-2 ** 80, max_value=2 ** 80),
                        st.sets(st.text(max_size=3), max_size=3), st.timedeltas(),
                        st.datetimes(timezones=st.timezones()), st.lists(st.integers(), max_size=2))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.dictionaries(st.text(min_size=1).filter(lambda k: not k.startswith("$")), flat_values),
                 st.lists(flat_values, max_size=4)))
def test_flat_json_writes_what_to_json_writes(value):
    """The store's fast encoder of row images and keys writes what to_json writes, character for character,
    whatever the values (a float, a nested list or a huge int take to_json's own path)."""
    assert flat_json(value) == to_json(value)
    assert flat_json(tuple(value) if isinstance(value, list) else value) == to_json(value)


def test_row_change_round_trip():
    r = RowChange(schema="shop", table="orders", op="update", pk=("O1",), before={"amount": Decimal("1.10")},
                  after={"amount": Decimal("1.10"), "at": dt.datetime(2026, 1, 1, 0, 0, 0, 123000)},
                  txid="0-1-9", row_index=2, binlog_file="binlog.000003", end_pos=812,
                  commit_time=1.5, commit_clock="row_column")
    assert RowChange.from_dict(from_json(to_json(r.to_dict()))) == r
    assert r.coordinates == "binlog.000003:812#0-1-9/2"


def test_packed_records_are_pickled_once(monkeypatch):
    """A transaction's rows as a reader's process hands them on (core.records.Packed): the judge that received them
    hands them on again as the bytes they came in, without pickling a row."""
    rows = Packed(RowChange(schema="shop", table="payments", op="insert", pk=(f"T{i}",), before=None,
                            after={"amount": Decimal("10.00"), "at": dt.datetime(2026, 1, 1, 0, 0, i)},
                            txid="0-1-9", row_index=i, binlog_file="binlog.000003", end_pos=812 + i,
                            commit_time=1.5, commit_clock="gtid_commit_ts") for i in range(3))
    tx = Transaction(rows=rows, position=BinlogPosition(gtid="0-1-9"), commit_time=1.5)
    received = pickle.loads(pickle.dumps(tx, pickle.HIGHEST_PROTOCOL))
    assert received == tx and received.rows == tuple(rows) and type(received.rows) is Packed

    def pickled_again(_row: RowChange) -> None:
        raise AssertionError("a row pickled again")

    monkeypatch.setattr(RowChange, "__reduce__", pickled_again)
    with pytest.raises(AssertionError, match="pickled again"):
        pickle.dumps(tuple(received.rows))
    handed_on = pickle.loads(pickle.dumps([received.rows, received.rows], pickle.HIGHEST_PROTOCOL))
    assert handed_on == [tuple(rows), tuple(rows)]
