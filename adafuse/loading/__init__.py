"""Loading a model and its tokenizer: the bundled GGUF pair converted once (bundled.py, gguf.py), and any hub or
local model at a pinned revision, placed on its device (pretrained.py)."""
