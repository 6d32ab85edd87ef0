"""Text as the models read it: each model's tokenisation (tokenisation.py), token bytes and the UTF-8 rule (tokens.py),
words (words.py), another model's text in this one's tokens (align.py), and a prompt's length checked off the engine's
thread (prompt_check.py)."""
