"""What `method=single` must equal: transformers' own greedy `generate()`."""

import torch
from transformers import GenerationConfig


def hf_greedy(member, prompt: str, budget: int) -> list[int]:
    """transformers' own greedy decoding with the model's own generation config (its eos ids included:
    never the set under test), the final eos dropped as `single` drops it."""
    ids = torch.tensor([member.tokenisation.encode(prompt)], device=member.device)
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=budget)
    with torch.inference_mode():
        out = member.model.generate(ids, generation_config=config, attention_mask=torch.ones_like(ids))
    eos = member.model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    new = out[0, ids.shape[1] :].tolist()
    return new[:-1] if new and new[-1] in eos else new
