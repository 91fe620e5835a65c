"""The store's bulky values packed: JSON text compressed with a zstd dictionary trained on the store's own data.

Row images, event bodies and the engine's entries are JSON of a few hundred bytes each that repeat the
same names and shapes. Compressed one at a time they barely shrink; with a dictionary trained on the
first values of their kind they shrink four to five times, for about 1.5 µs each (issue 47). What is
packed is the same JSON text the store kept before, so every reader gets back exactly the text it read.

A packed value is bytes: a first byte 0 and the UTF-8 text while its kind has no dictionary yet, or the
dictionary's id (1 to MAX_DICTIONARIES) and a zstd frame without its four-byte magic number (the frame
format's "magicless" variant; cut and put back here, since python-zstandard's own magicless compression
costs 1 µs a value more than its plain one). A value that an older
version wrote is read as it is: text (str), or in PostgreSQL the bytes of that text (its column became
bytea), which never start with a byte below 32.

A kind's dictionary is trained once TRAIN_SAMPLES values of it were packed, and stored in `dictionaries`
inside the writer's transaction. Dictionaries are never changed or deleted, since every value packed with
one needs it; a dictionary whose transaction rolled back is forgotten, and trained again. In the same
transaction the row images and event bodies kept as text while their dictionary was being learned are packed
with it (store.batch.Batch.repack): they were a megabyte of every store, 30 bytes a record read over a store's
first three minutes at 20 orders/s. The engine's entries are left as they are: they are rewritten as the
engine changes them and dropped at its horizon, and a group's judges write theirs beside each other.
"""

from __future__ import annotations

import threading
from typing import Any

import zstandard

from oncewatch.store.errors import StoreError

# What is packed: row images, event bodies, the engine's entries. Each has a dictionary of its own.
ROW, EVENT, ENGINE = "row", "event", "engine"
KINDS = (ROW, EVENT, ENGINE)
TRAIN_SAMPLES = 2000
DICTIONARY_BYTES = 16 * 1024  # 8 and 16 KiB did as well as each other on the shop's data; 16 for wider shops
LEVEL = 3
RAW = 0
MAX_DICTIONARIES = 31  # ids stay below any byte that starts JSON text


def as_bytes(value: str | bytes | None) -> bytes | None:
    """A packed column's value moved from an older table: text PostgreSQL kept before the column became bytea
    moves as that text's bytes, which `unpack` reads as the text it was."""
    return value.encode() if isinstance(value, str) else value


class PackedValueError(StoreError):
    """A packed value the store cannot read back: its dictionary is missing, or its bytes are damaged."""


MAGIC = b"\x28\xb5\x2f\xfd"  # the first four bytes of every zstd frame


class Packer:
    """Packs values for a writer and unpacks them for anyone, over one store connection.

    `pack` and `learned`/`forget` are the writer's (under its store lock); `unpack` may be called
    from any thread."""

    def __init__(self, conn: Any, train_samples: int = TRAIN_SAMPLES):
        self.conn = conn
        self.train_samples = train_samples
        self._compressors: dict[str, tuple[int, zstandard.ZstdCompressor]] = {}
        self._decompressors: dict[int, zstandard.ZstdDecompressor] = {}
        self._samples: dict[str, list[bytes]] = {k: [] for k in KINDS}
        self._unsaved: list[tuple[str, int]] = []  # dictionaries stored in the transaction under way
        self._loaded = False
        self._read_lock = threading.Lock()

    # ------------------------------------------------------------ writing

    def pack(self, kind: str, text: str) -> bytes:
        """`text` (JSON) as the store keeps it, inside the writer's transaction on `conn`."""
        if not self._loaded:
            self._load_newest()
        data = text.encode()
        made = self._compressors.get(kind)
        if made is None:
            samples = self._samples[kind]
            samples.append(data)
            if len(samples) < self.train_samples:
                return b"\x00" + data
            made = self._train(kind, samples)
            if made is None:
                return b"\x00" + data
        did, compressor = made
        frame = compressor.compress(data)
        return bytes((did,)) + frame[len(MAGIC):]

    def trained(self) -> list[str]:
        """The kinds whose dictionary was trained in the writer's transaction under way: their values kept as text
        are packed with it before it commits (store.batch.Batch.repack, once a transaction)."""
        return [kind for kind, _ in self._unsaved]

    def committed(self) -> None:
        """The writer's transaction committed: the dictionaries it stored are there for good."""
        self._unsaved.clear()

    def rolled_back(self) -> None:
        """The writer's transaction rolled back: the dictionaries it stored are gone, so nothing more is packed
        with them (what was packed with them went with the transaction)."""
        for kind, did in self._unsaved:
            self._compressors.pop(kind, None)
            self._decompressors.pop(did, None)
        self._unsaved.clear()

    def _train(self, kind: str, samples: list[bytes]) -> tuple[int, zstandard.ZstdCompressor] | None:
        try:
            trained = zstandard.train_dictionary(DICTIONARY_BYTES, samples)
        except zstandard.ZstdError:
            # too little variety to learn from (a shop of one repeated row): try again on the next samples
            samples.clear()
            return None
        samples.clear()
        (top,), = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM dictionaries")
        did = top + 1
        if did > MAX_DICTIONARIES:
            return None  # every id is taken (retrained dictionaries of many writers): the values stay as text
        self.conn.execute("INSERT INTO dictionaries (id, kind, data) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                          (did, kind, trained.as_bytes()))
        # another writer of a shared store may have stored its own under this id first: use the one stored
        stored_kind, data = self.conn.execute("SELECT kind, data FROM dictionaries WHERE id = ?", (did,)).fetchone()
        if stored_kind != kind:
            return None
        self._unsaved.append((kind, did))
        return self._use(kind, did, bytes(data))

    def _load_newest(self) -> None:
        """The newest stored dictionary of each kind, which this writer goes on packing with."""
        for did, kind, data in self.conn.execute("SELECT id, kind, data FROM dictionaries ORDER BY id"):
            if kind in self._samples:
                self._use(kind, did, bytes(data))
        self._loaded = True

    def _use(self, kind: str, did: int, data: bytes) -> tuple[int, zstandard.ZstdCompressor]:
        dictionary = zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_FULLDICT)
        dictionary.precompute_compress(level=LEVEL)  # digested once, not at every value (3.3 against 1.7 µs a value)
        made = self._compressors[kind] = (did, zstandard.ZstdCompressor(
            dict_data=dictionary, level=LEVEL, write_checksum=False, write_content_size=True, write_dict_id=False))
        return made

    # ------------------------------------------------------------ reading

    @staticmethod
    def waiting(value: Any) -> bool:
        """A packed value kept as text while its kind had no dictionary yet."""
        return isinstance(value, (bytes, memoryview)) and len(value) > 0 and value[0] == RAW

    def unpack(self, value: bytes | str | None) -> str | None:
        """The JSON text of a packed value (None stays None)."""
        if value is None or isinstance(value, str):
            return value
        value = bytes(value)
        head = value[0] if value else 32
        if head == RAW:
            return value[1:].decode()
        if head > MAX_DICTIONARIES:
            return value.decode()  # an older version's text, in a bytea column
        with self._read_lock:
            decompressor = self._decompressors.get(head) or self._decompressor(head)
            try:
                return decompressor.decompress(MAGIC + value[1:]).decode()
            except zstandard.ZstdError as exc:
                raise PackedValueError(f"a stored value packed with dictionary {head} does not unpack ({exc}): "
                                       f"the store's file is damaged; restore it from a backup") from exc

    def _decompressor(self, did: int) -> zstandard.ZstdDecompressor:
        row = self.conn.execute("SELECT data FROM dictionaries WHERE id = ?", (did,)).fetchone()
        if row is None:
            raise PackedValueError(f"a stored value was packed with dictionary {did}, which the store does not hold: "
                                   f"the store is damaged or was edited; restore it from a backup")
        dictionary = zstandard.ZstdCompressionDict(bytes(row[0]), dict_type=zstandard.DICT_TYPE_FULLDICT)
        made = self._decompressors[did] = zstandard.ZstdDecompressor(dict_data=dictionary)
        return made
