"""MariaDB GTIDs ("domain-server-sequence") and GTID sets ("0-1-10,1-2-5"), parsed and written in one place:
the binlog collector, the CDC assembler and the pipeline check all read them."""

from __future__ import annotations

GtidSet = dict[int, tuple[int, int]]  # domain -> (server id, sequence)


def parse(txid: str) -> tuple[int, int, int] | None:
    """(domain, server, sequence) of a MariaDB GTID; None for anything else (a snapshot's name, Canal's
    coordinates)."""
    parts = txid.split("-")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        return None


def gtid_set(text: str) -> GtidSet:
    """'0-1-10,1-2-5' -> {domain: (server_id, seq)}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        domain, server, seq = (int(x) for x in part.split("-"))
        out[domain] = (server, seq)
    return out


def gtid_text(gset: GtidSet) -> str:
    return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(gset.items()))
