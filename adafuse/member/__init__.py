"""A member: one causal LM as a decoder sees it (member.py): the weights as the engine runs them (runner.py), one
example's context and its forks (context.py) over KV buffers read in place (cache.py), and the passes it asks for as
data (passes.py)."""
