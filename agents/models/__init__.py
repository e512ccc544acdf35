"""Models: names and folders (:mod:`.load`), recipes (:mod:`.recipes`), builds (:mod:`.build`),
their quality checks (:mod:`.quality`), tokenizer, supervised training, adapters and GGUF conversion."""
