"""danastar.data: tokenizers, corpus preparation and the token loader.

* `danastar.data.tokenizers` — `load_tokenizer(spec)`, `train_bpe(texts, vocab_size)`.
* `danastar.data.sources` — the corpora: Shakespeare and prose (downloaded once), local files,
  FineWeb; `prose`, `prose_formats` and `packages` fetch and read the prose corpus's parts.
* `danastar.data.prepare` — `prepare_source` (what `danastar prepare` runs), `ensure_prepared`.
* `danastar.data.loader` — `TokenData`, `TrainLoader`, `validation_batches` (imports torch).

Nothing is imported here, so that `danastar prepare` does not pay for torch.
"""
