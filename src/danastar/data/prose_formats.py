"""Readers of the file formats the prose corpus comes in, each turning bytes into plain text.

Debian packages (`ar` archives holding `data.tar.xz`), SWORD modules (zText/zCom: zlib blocks
indexed per verse, OSIS markup), R lazy-load databases (`Rdata.rdx`/`Rdata.rdb`: zlib-compressed
R serialisations), dictd dictionaries (`.index` + gzip `.dict.dz`). Only the standard library.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import io
import re
import struct
import tarfile
import zlib
from collections.abc import Iterable

# --- Debian packages ------------------------------------------------------------------------------


def deb_files(deb: bytes, wanted: Iterable[str]) -> dict[str, bytes]:
    """The files named in `wanted` (paths as `usr/share/...`) from a `.deb`'s `data.tar.xz`."""
    if not deb.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar header)")
    position, data = 8, None
    while position + 60 <= len(deb):
        name = deb[position:position + 16].decode().strip().rstrip("/")
        size = int(deb[position + 48:position + 58].decode())
        body = deb[position + 60:position + 60 + size]
        if name.startswith("data.tar"):
            data = body
        position += 60 + size + size % 2  # members are 2-byte aligned
    if data is None:
        raise ValueError("the Debian package has no data.tar member")
    wanted = set(wanted)
    found = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            if member.isfile() and name in wanted:
                found[name] = archive.extractfile(member).read()
    missing = wanted - found.keys()
    if missing:
        raise ValueError(f"the Debian package lacks {', '.join(sorted(missing))}")
    return found


# --- SWORD modules --------------------------------------------------------------------------------


def sword_entries(blocks: bytes, index: bytes, data: bytes, entry_size: int) -> list[str]:
    """The distinct entries of one testament of a zText/zCom module, in index order.

    `blocks` (`.bzs`): per block the offset, compressed and uncompressed size in `data` (`.bzz`);
    `index` (`.bzv`): per verse the block, offset and size (10-byte entries, 12 for zCom4/zText4).
    Verses linked to one text (a comment on several verses) point at the same bytes: kept once.
    """
    sizes = [struct.unpack_from("<III", blocks, i) for i in range(0, len(blocks), 12)]
    cache: dict[int, bytes] = {}
    entry_format = "<IIH" if entry_size == 10 else "<III"
    seen, entries = set(), []
    for position in range(0, len(index) - entry_size + 1, entry_size):
        entry = struct.unpack_from(entry_format, index, position)
        block, start, size = entry
        if size == 0 or entry in seen:
            continue
        seen.add(entry)
        if block not in cache:
            offset, compressed, uncompressed = sizes[block]
            cache[block] = zlib.decompress(data[offset:offset + compressed])
            if len(cache[block]) != uncompressed:
                raise ValueError(f"SWORD block {block} does not have its recorded size")
        entries.append(cache[block][start:start + size].decode("utf-8"))
    return entries


# A book or chapter starts: `<div osisID="Gen" sID=".." type="book"/>`, `<chapter osisID="Gen.1"
# sID="Gen.1"/>` (their ends carry eID and no osisID).
SECTION_START = re.compile(r'<(?:chapter|div)\b[^>]*?\bosisID="([^"]+)"[^>]*\bsID="[^>]*>')


def sword_sections(entries: list[str], joiner: str) -> dict[str, str]:
    """Entries grouped by the book or chapter they fall in (its OSIS id, e.g. `Ps.23`; text
    before a book's first chapter is keyed by the book), as plain text. `joiner` separates
    entries: a space for the verses of a Bible, a blank line for the comments of a commentary."""
    stream = joiner.join(entries)
    sections: dict[str, list[str]] = {}
    starts = list(SECTION_START.finditer(stream))
    bounds = [0, *(m.start() for m in starts), len(stream)]
    keys = ["", *(m.group(1) for m in starts)]
    for key, begin, end in zip(keys, bounds, bounds[1:]):
        text = osis_text(stream[begin:end])
        if text and key:
            sections.setdefault(key, []).append(text)
    return {key: "\n\n".join(parts) for key, parts in sections.items()}


NOTE = re.compile(r"<note\b[^>]*?(?:/>|>.*?</note>)", re.DOTALL)
MILESTONE_DIV = re.compile(r'<(?:div|chapter)\b[^>]*type="x-milestone"[^>]*>')
BLOCK_TAG = re.compile(r"</?(?:div|chapter|title|p|lg|list|table|row|head)\b[^>]*>")
LINE_TAG = re.compile(r"(?:\s*</?(?:l|lb|item|speaker)\b[^>]*>)+")  # a run: one line end
CELL_TAG = re.compile(r"</?cell\b[^>]*>")
ANY_TAG = re.compile(r"<[^>]*>")


def osis_text(markup: str) -> str:
    """OSIS markup as plain text: notes (footnotes, cross references) left out, titles and
    paragraphs on their own, poetry lines and list items one per line, other tags dropped."""
    text = NOTE.sub("", markup)
    text = MILESTONE_DIV.sub("", text)
    text = LINE_TAG.sub("\n", text)
    text = BLOCK_TAG.sub("\n\n", text)
    text = CELL_TAG.sub(" ", text)
    text = html.unescape(ANY_TAG.sub("", text))
    return tidy(text)


def tidy(text: str) -> str:
    """Spaces collapsed within lines, lines stripped, at most one blank line in a row."""
    lines = [re.sub(r"[^\S\n]+", " ", line).strip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def reflow(text: str) -> str:
    """A hard-wrapped text as paragraphs: the lines between blank lines joined by spaces."""
    paragraphs = re.split(r"\n[^\S\n]*\n", text.replace("\r\n", "\n"))
    return "\n\n".join(p for p in (" ".join(p.split()) for p in paragraphs) if p)


# --- R lazy-load databases (janeaustenr's data) ---------------------------------------------------

SYMBOL, PAIRLIST, CHARS, LOGICAL, INTEGER, REAL, STRINGS, LIST = 1, 2, 9, 10, 13, 14, 16, 19
NIL, REFERENCE = 254, 255


class RReader:
    """The subset of R's XDR serialisation (format 2 or 3) that data packages of text use:
    character, integer, logical and double vectors, lists, pairlists, symbols, attributes.
    A vector with a `names` attribute becomes a dict."""

    def __init__(self, payload: bytes):
        if payload[:2] != b"X\n":
            raise ValueError("not an XDR R serialisation")
        self.data, self.position, self.symbols = payload, 2, []
        version = self.integer()
        self.position += 8  # writer's and minimal R versions
        if version == 3:
            length = self.integer()  # of the native encoding's name, skipped
            self.position += length

    def integer(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.position)
        self.position += 4
        return value

    def read(self):
        flags = self.integer()
        kind, has_attributes, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == NIL:
            return None
        if kind == REFERENCE:
            index = flags >> 8 or self.integer()
            return self.symbols[index - 1]
        if kind == SYMBOL:
            self.symbols.append(self.read())
            return self.symbols[-1]
        if kind == PAIRLIST:
            return self.pairlist(has_attributes, has_tag)
        if kind == CHARS:
            length = self.integer()
            if length == -1:
                return None  # NA_character_
            text = self.data[self.position:self.position + length].decode("utf-8")
            self.position += length
            return text
        value = self.vector(kind)
        if has_attributes:
            names = (self.read() or {}).get("names")
            if names is not None:
                value = dict(zip(names, value))
        return value

    def vector(self, kind: int) -> list:
        length = self.integer()
        if kind in (STRINGS, LIST):
            return [self.read() for _ in range(length)]
        if kind in (INTEGER, LOGICAL, REAL):
            code, width = (">d", 8) if kind == REAL else (">i", 4)
            values = [struct.unpack_from(code, self.data, self.position + width * i)[0]
                      for i in range(length)]
            self.position += width * length
            return values
        raise ValueError(f"R serialisation type {kind} is not supported")

    def pairlist(self, has_attributes: int, has_tag: int) -> dict:
        """A pairlist (attributes, arguments) as a dict of its tagged values."""
        if has_attributes:
            self.read()
        tag = self.read() if has_tag else None
        value = self.read()
        rest = self.read() or {}
        return {tag: value, **rest}


def r_object(serialised: bytes):
    return RReader(serialised).read()


def rdb_objects(rdx: bytes, rdb: bytes) -> dict:
    """The variables of an R lazy-load database (`Rdata.rdx` index, `Rdata.rdb` data)."""
    table = r_object(gzip.decompress(rdx) if rdx[:2] == b"\x1f\x8b" else zlib.decompress(rdx[4:]))
    if table.get("compressed") not in (True, 1, [True], [1]):
        raise ValueError("only zlib-compressed R lazy-load databases are supported")
    objects = {}
    for name, (offset, length) in table["variables"].items():
        record = rdb[offset:offset + length]
        objects[name] = r_object(zlib.decompress(record[4:]))  # after the uncompressed length
    return objects


CHAPTER_LINE = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\.?\s*$", re.IGNORECASE)


def novel_chapters(lines: list[str]) -> list[str]:
    """A novel given as its lines, cut at its `CHAPTER n` lines into reflowed chapters (what
    comes before the first chapter line stays with the first chapter)."""
    heads = [i for i, line in enumerate(lines) if line and CHAPTER_LINE.match(line)]
    bounds = [0, *heads[1:], len(lines)]
    chapters = ["\n".join(line or "" for line in lines[a:b]) for a, b in zip(bounds, bounds[1:])]
    return [text for text in map(reflow, chapters) if text]


# --- dictd dictionaries ---------------------------------------------------------------------------

DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def dictd_number(text: str) -> int:
    value = 0
    for character in text:
        value = value * 64 + DICTD_DIGITS.index(character)
    return value


def dictd_entries(index: str, dictionary: bytes) -> list[tuple[str, str]]:
    """(headword, entry text) of a dictd dictionary, in index order, leaving out its
    `00database...` header entries."""
    text = gzip.decompress(dictionary) if dictionary[:2] == b"\x1f\x8b" else dictionary
    entries = []
    for line in index.splitlines():
        headword, offset, length = line.split("\t")[:3]
        if headword.startswith("00database"):
            continue
        start = dictd_number(offset)
        entries.append((headword, text[start:start + dictd_number(length)].decode("utf-8")))
    return entries


# --- de-duplication -------------------------------------------------------------------------------

# A paragraph shorter than this (in words) is never a duplicate: short lines ("CHAPTER I.",
# "Selah.", "Yes.") repeat in any text.
DUPLICATE_MIN_WORDS = 8


def paragraph_fingerprint(paragraph: str) -> bytes:
    """Equal for paragraphs that differ only in case, punctuation and spacing."""
    letters = re.sub(r"[\W_]+", " ", paragraph.lower()).split()
    return hashlib.blake2b(" ".join(letters).encode(), digest_size=16).digest()


def drop_repeated_paragraphs(text: str, seen: set[bytes]) -> tuple[str, int]:
    """`text` without its paragraphs of at least DUPLICATE_MIN_WORDS words already in `seen`
    (which it then adds its own to); also the number dropped."""
    kept, dropped = [], 0
    for paragraph in text.split("\n\n"):
        if len(paragraph.split()) >= DUPLICATE_MIN_WORDS:
            fingerprint = paragraph_fingerprint(paragraph)
            if fingerprint in seen:
                dropped += 1
                continue
            seen.add(fingerprint)
        kept.append(paragraph)
    return "\n\n".join(kept).strip(), dropped
