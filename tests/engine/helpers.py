from adafuse.model import Member


def clone(member: Member) -> Member:
    """A second member over the same weights and tokenizer, with its own context and cache."""
    return Member(member.name, member.tokenizer, member.model, chat_template=member.chat_template)
