"""The binlog clock of the absence rules while the binlog is busy (`oncewatch.checks.clocks.binlog_watermark`)."""

from __future__ import annotations

from oncewatch.checks.clocks import binlog_watermark
from oncewatch.core.gtids import gtid_set


def test_an_applied_end_vouches_for_the_time_it_was_asked_for():
    ends = [(100.25, gtid_set("0-1-10")), (100.5, gtid_set("0-1-12")), (100.75, gtid_set("0-1-15"))]
    covered, rest = binlog_watermark(ends, gtid_set("0-1-12"))
    assert covered == 100.5
    assert rest == ends[2:]  # still ahead of what is applied: kept for a later tick


def test_no_end_applied_yet_gives_no_time_and_keeps_them_all():
    ends = [(100.25, gtid_set("0-1-10"))]
    assert binlog_watermark(ends, gtid_set("0-1-9")) == (None, ends)
    assert binlog_watermark([], gtid_set("0-1-9")) == (None, [])


def test_every_domain_of_an_end_must_be_applied():
    ends = [(100.25, gtid_set("0-1-10,1-2-5"))]
    assert binlog_watermark(ends, gtid_set("0-1-20,1-2-4")) == (None, ends)
    assert binlog_watermark(ends, gtid_set("0-1-10")) == (None, ends)  # a domain not applied at all
    assert binlog_watermark(ends, gtid_set("0-1-10,1-2-5,2-3-1")) == (100.25, [])

