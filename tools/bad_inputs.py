"""Every bad input the test suite tries, and the one line each is refused with.

tests/config/test_bad_inputs.py holds run.py (through `eval.runner.main`, as run.py calls it) and
`python -m eval.report` to every case of theirs: the error's class and message, nothing changed on disk,
no model loaded. The other cases are tried where their models, their server or their stand-in for the hub
are (`tried_in`), against the same message. docs/configuration.md's table of bad inputs is rendered from
this list (`python -m tools.render_docs`; the docs check compares). In a message, {dir} is the folder a
case's files are in, and any other {name} stands for a part that varies (a process id, a token count). The
situations a case's `setup` names, and the message as a pattern, are the tests' (tests/support/bad_inputs.py).
"""

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class BadInput:
    key: str  # the case's name (a test id)
    what: str  # the input, as the table says it
    args: tuple[str, ...]  # run.py's overrides or eval.report's arguments; {dir} as in the module docstring
    error: str  # the class of the error raised
    message: str  # what run.py prints after "ErrorClass: " (eval.report after "error: ")
    tool: str = "run.py"
    files: dict[str, str | bytes] = field(default_factory=dict)  # written below {dir} first
    setup: str | None = None  # a prepared situation: a function of SETUPS
    run_dir: str = "{dir}/run"
    slow: bool = False  # loads (or may convert) the bundled models
    tried_in: str | None = None  # where a case of another tool is tried (a test file that names its key)


CUSTOM = ("task=custom", "task.path={dir}/prompts.jsonl")
PROMPTS = '{"id": "a", "prompt": "Question: 2 + 2?\\nAnswer:"}\n'
LOCAL_GGUF = ("method=single", "model_pair.members.m0.bundle=null", "model_pair.members.m0.sha256=null")

CASES = [
    # ---- settings: refused when the typed settings are built, before any file is read -----------------
    BadInput(
        "tau",
        "a negative τΔ",
        ("method.tau=-0.1",),
        "ConfigError",
        "tau must be >= 0 (tau > 1 means 'never confident'), got -0.1",
    ),
    BadInput("branches", "B < 1", ("method.branches=0",), "ConfigError", "branches must be >= 1, got 0"),
    BadInput("max_words", "M < 1", ("method.max_words=0",), "ConfigError", "max_words must be >= 1, got 0"),
    BadInput(
        "fixed_words",
        "fixed_words < 1",
        ("method.fixed_words=0",),
        "ConfigError",
        "fixed_words must be >= 1 (or null to disable), got 0",
    ),
    BadInput(
        "max_new_tokens",
        "a token budget < 1",
        ("task.max_new_tokens=0",),
        "ConfigError",
        "task.max_new_tokens must be >= 1, got 0",
    ),
    BadInput(
        "shard",
        "a shard outside [0, num_shards)",
        ("task.shard=2",),
        "ConfigError",
        "task.shard must be in [0, task.num_shards) with num_shards >= 1, got shard=2, num_shards=1",
    ),
    BadInput(
        "num_shards",
        "num_shards < 1",
        ("task.num_shards=0",),
        "ConfigError",
        "task.shard must be in [0, task.num_shards) with num_shards >= 1, got shard=0, num_shards=0",
    ),
    BadInput(
        "limit", "task.limit < 1", ("task.limit=0",), "ConfigError", "task.limit must be >= 1 (or null for all), got 0"
    ),
    BadInput("batch_size", "batch_size < 1", ("batch_size=0",), "ConfigError", "batch_size must be >= 1, got 0"),
    BadInput(
        "threads_negative",
        "threads < 1",
        ("threads=-1",),
        "ConfigError",
        "threads must be >= 1 (or null for torch's default), got -1",
    ),
    BadInput(
        "threads_zero",
        "threads 0",
        ("threads=0",),
        "ConfigError",
        "threads must be >= 1 (or null for torch's default), got 0",
    ),
    BadInput(
        "added_knob",
        "a misspelt knob added with +",
        ("+method.taux=0.5",),
        "ConfigError",
        "method.taux is not a setting (a key added with + too must be one); method has: tau, max_words, branches, "
        "max_word_tokens, fixed_words, diversity, name",
    ),
    BadInput(
        "added_model_key",
        "a misspelt model key added with +",
        ("+model_pair.members.m0.revison=main",),
        "ConfigError",
        "model_pair.members.m0.revison is not a setting (a key added with + too must be one); "
        "model_pair.members.m0 has: name, path, bundle, sha256, dtype, device, trust_remote_code, revision, "
        "chat_template",
    ),
    BadInput(
        "empty_stop",
        "an empty stop string",
        ('task.stop=[""]',),
        "ConfigError",
        "task.stop holds an empty string, which would end every generation before its first word; remove it "
        "(task.stop=[] for no stop string)",
    ),
    BadInput(
        "unknown_escape",
        "a stop string with an unknown escape",
        (r'task.stop=["\q"]',),
        "ConfigError",
        "task.stop: \\q is not an escape a stop string reads; it reads \\n, \\r, \\t, \\\\, \\xHH, \\uHHHH and "
        "\\UHHHHHHHH",
    ),
    BadInput(
        "variant",
        "an unknown data variant",
        ("data.variant=papr",),
        "ConfigError",
        "data.variant must be one of ('canonical', 'paper'), got 'papr'",
    ),
    BadInput(
        "wandb_mode",
        "an unknown W&B mode",
        ("wandb.mode=bogus",),
        "ConfigError",
        "wandb.mode must be one of offline, online, disabled, got 'bogus'",
    ),
    BadInput(
        "member",
        "method=single with a member the pair lacks",
        ("method=single", "method.member=2"),
        "ConfigError",
        "single: member 2 does not exist; the ensemble has 2 models",
    ),
    BadInput(
        "dtype",
        "an unknown dtype",
        ("model_pair.members.m0.dtype=float8",),
        "ConfigError",
        "model 'smollm2_135m': dtype 'float8' is not one of ('float32', 'bfloat16', 'float16', 'auto')",
    ),
    BadInput(
        "device",
        "a device torch does not know",
        ("model_pair.members.m0.device=tpu",),
        "ConfigError",
        "device 'tpu' is not a torch device (e.g. auto, cpu, cuda, cuda:1): Expected one of cpu, cuda, ipu, xpu, "
        "mkldnn, opengl, opencl, ideep, hip, ve, fpga, maia, xla, lazy, vulkan, mps, meta, hpu, mtia, "
        "privateuseone device type at start of device string: tpu",
    ),
    BadInput(
        "path_and_bundle",
        "a model path set over a bundled model",
        ("model_pair.members.m0.path={dir}/model",),
        "ConfigError",
        "model 'smollm2_135m': both path '{dir}/model' and bundle 'smollm2_135m' are set; to load the path in "
        "place of the bundle, set bundle and the bundle's sha256 to null too (model_pair.members.<key>.bundle=null "
        "model_pair.members.<key>.sha256=null)",
    ),
    # ---- names and data: refused when the task is read ---------------------------------------------------
    BadInput(
        "extractor",
        "an unknown extractor",
        ("task.extract=[nope]",),
        "UnknownNameError",
        "unknown extractor 'nope'. Valid choices: answer_number, first_line, last_number, strip",
    ),
    BadInput(
        "paper_variant",
        "data.variant=paper without data.dir",
        ("data.variant=paper", "data.dir=null"),
        "ConfigError",
        "data.variant=paper reads the paper's own evaluation files: set data.dir to a folder that holds "
        "adafuse_local_datasets/ (the authors' local_datasets/, as in ../shared/data)",
    ),
    BadInput(
        "custom_without_path",
        "task=custom without task.path",
        ("task=custom",),
        "ConfigError",
        'task \'custom\' reads its examples from your file: set task.path=FILE.jsonl, one {"id": ..., "prompt": '
        '..., "references": [...]} per line (references optional)',
    ),
    BadInput(
        "missing_file",
        "a data file that does not exist",
        ("task=custom", "task.path={dir}/nope.jsonl"),
        "DataError",
        "data file {dir}/nope.jsonl does not exist",
    ),
    BadInput(
        "empty_file",
        "a prompts file with no prompts",
        CUSTOM,
        "DataError",
        "{dir}/prompts.jsonl holds no prompts",
        files={"prompts.jsonl": ""},
    ),
    BadInput(
        "malformed_json",
        "a line that is not JSON",
        CUSTOM,
        "DataError",
        "{dir}/prompts.jsonl:2: malformed JSON (Expecting value)",
        files={"prompts.jsonl": PROMPTS + '{"id": "b", "prompt": \n'},
    ),
    BadInput(
        "not_utf8",
        "a data file that is not UTF-8",
        CUSTOM,
        "DataError",
        "{dir}/prompts.jsonl:2: not UTF-8 text (byte 0xe9 at byte 27 of the line); save the file as UTF-8",
        files={"prompts.jsonl": PROMPTS.encode() + b'{"id": "b", "prompt": "caf\xe9"}\n'},
    ),
    BadInput(
        "not_gzip",
        "a .gz data file that is not gzip",
        ("task=custom", "task.path={dir}/prompts.jsonl.gz"),
        "DataError",
        "{dir}/prompts.jsonl.gz: not a readable gzip file (Not a gzipped file (b'{\"'))",
        files={"prompts.jsonl.gz": PROMPTS},
    ),
    BadInput(
        "missing_field",
        "a prompt line without its prompt",
        CUSTOM,
        "DataError",
        "{dir}/prompts.jsonl:2: missing field 'prompt'",
        files={"prompts.jsonl": PROMPTS + '{"id": "b"}\n'},
    ),
    BadInput(
        "empty_prompt",
        "an empty prompt",
        CUSTOM,
        "DataError",
        "{dir}/prompts.jsonl:2: example 'b' has an empty prompt",
        files={"prompts.jsonl": PROMPTS + '{"id": "b", "prompt": ""}\n'},
    ),
    BadInput(
        "duplicate_id",
        "two prompts with one id",
        CUSTOM,
        "DataError",
        "{dir}/prompts.jsonl:2: duplicate id 'a'",
        files={"prompts.jsonl": PROMPTS + PROMPTS},
    ),
    # ---- the run directory: refused before any model loads, leaving it as it was ------------------------
    BadInput(
        "unwritable_results",
        "a run directory below a file",
        CUSTOM,
        "ResultsDirError",
        "cannot create or write the run directory {dir}/results/run ({dir}/results is a file, not a folder); point "
        "results_dir (or hydra.run.dir) at a folder this process can write",
        files={"prompts.jsonl": PROMPTS, "results": "a file where a folder should be"},
        run_dir="{dir}/results/run",
    ),
    BadInput(
        "other_settings",
        "a run directory that holds a run with other settings",
        (*CUSTOM, "method.tau=0.5"),
        "ResumeMismatchError",
        "{dir}/run holds a run with other settings (method.tau); resuming would mix predictions. Choose another "
        "hydra.run.dir or delete the directory.",
        files={"prompts.jsonl": PROMPTS},
        setup="run_with_the_defaults",
    ),
    BadInput(
        "other_data",
        "a run directory that holds predictions made from other data (another prompts file, another data folder's "
        "files, the hub for local files, another hub commit)",
        CUSTOM,
        "ResumeMismatchError",
        "{dir}/run holds predictions made from other inputs: data file {dir}/prompts.jsonl: sha256 000000000000 then, "
        "{now} now. Their prompts or models are not this process's, so one run must not mix them: write this one to "
        "another directory (results_dir=... or hydra.run.dir=...), or resume it with the data and models it recorded "
        "(config.yaml, source; docs/sweeps.md, 'One run, one source').",
        files={"prompts.jsonl": PROMPTS},
        setup="run_from_other_prompts",
    ),
    BadInput(
        "other_device",
        "a run directory that holds predictions decoded on another device and dtype",
        CUSTOM,
        "ResumeMismatchError",
        "{dir}/run holds predictions decoded on smollm2_135m bfloat16 on cuda:0 (NVIDIA H200), {others}; this "
        "process would decode on {now} ({differences}). Outputs can differ in their last bits between the two, so "
        "one run must not mix them: resume it on its recorded device and dtype (each model's `device` and `dtype` "
        "settings, the same torch), or write this one to another directory (results_dir=... or hydra.run.dir=...).",
        files={"prompts.jsonl": PROMPTS},
        setup="run_on_a_gpu",
    ),
    BadInput(
        "busy_shard",
        "a shard that another process is decoding (its settings other than this one's)",
        (*CUSTOM, "method.tau=1.5"),
        "ShardBusyError",
        "{dir}/run: shard 0 of 1 is being decoded by pid {pid} on {host}; wait for it to finish or stop it (two "
        "writers would decode the same examples twice)",
        files={"prompts.jsonl": PROMPTS},
        setup="shard_held_by_another_run",
    ),
    # ---- model files: refused when they are opened, before any weights load ------------------------------
    BadInput(
        "missing_gguf",
        "a model file that does not exist",
        (*CUSTOM, *LOCAL_GGUF, "model_pair.members.m0.path={dir}/missing.gguf"),
        "ModelFileError",
        "model 'smollm2_135m': model file {dir}/missing.gguf does not exist",
        files={"prompts.jsonl": PROMPTS},
    ),
    BadInput(
        "random_gguf",
        "random bytes as a .gguf",
        (*CUSTOM, *LOCAL_GGUF, "model_pair.members.m0.path={dir}/random.gguf", "cache_dir={dir}/cache"),
        "ModelFileError",
        "model 'smollm2_135m': {dir}/random.gguf is not a complete GGUF file (GGUF magic invalid); download it again",
        files={"prompts.jsonl": PROMPTS, "random.gguf": bytes(range(256)) * 16},
    ),
    BadInput(
        "truncated_gguf",
        "a truncated .gguf",
        (*CUSTOM, *LOCAL_GGUF, "model_pair.members.m0.path={dir}/truncated.gguf", "cache_dir={dir}/cache"),
        "ModelFileError",
        "model 'smollm2_135m': {dir}/truncated.gguf is not a complete GGUF file (cannot reshape array of size "
        "214336 into shape (49152,612)); download it again",
        files={"prompts.jsonl": PROMPTS},
        setup="truncated_gguf",
    ),
    BadInput(
        "no_config_json",
        "a model folder without config.json",
        (*CUSTOM, *LOCAL_GGUF, "model_pair.members.m0.path={dir}/model"),
        "ModelFileError",
        "model 'smollm2_135m': {dir}/model has no config.json, so it is not a model directory",
        files={"prompts.jsonl": PROMPTS, "model/weights.bin": "x"},
    ),
    BadInput(
        "truncated_safetensors",
        "a model folder whose model.safetensors is cut short",
        (*CUSTOM, *LOCAL_GGUF, "model_pair.members.m0.path={dir}/model"),
        "ModelFileError",
        "model 'smollm2_135m': {dir}/model/model.safetensors is not a complete safetensors file (Error while "
        "deserializing header: incomplete metadata, file not fully covered); download it again",
        files={"prompts.jsonl": PROMPTS},
        setup="truncated_safetensors",
        slow=True,
    ),
    # ---- prompts against the models: refused once the models are loaded, before any decoding -----------
    BadInput(
        "long_prompt",
        "a prompt longer than a model's context",
        ("task=custom", "task.path={dir}/long.jsonl"),
        "ContextLengthError",
        "example 'long' ({dir}/long.jsonl:1): model 'smollm2_135m': a prompt has 9001 tokens and decoding may add "
        "124, but the model's context holds 8192",
        files={"long.jsonl": '{"id": "long", "prompt": "' + "word " * 9000 + '"}\n'},
        slow=True,
    ),
    # ---- a pair file of your own (docs/your_own.md): refused as the run starts, before anything is read --------
    BadInput(
        "pair_name_taken",
        "a pair file of your own that kept another pair's name (a copy whose name: was left as it was)",
        ("hydra.searchpath=[file://{dir}/conf]", "model_pair=my_pair"),
        "ConfigError",
        "model_pair=my_pair is named 'llama_mistral', the name of conf/model_pair/llama_mistral.yaml: its runs would "
        "write into that pair's results (results/<task>/<method>/llama_mistral/). Give it a name of its own, e.g. "
        "name: my_pair in its file, or model_pair.name=... on the command line",
        tool="run.py, run_grid.py",
        files={
            "conf/model_pair/my_pair.yaml": (
                Path(__file__).parent.parent / "conf/model_pair/llama_mistral.yaml"
            ).read_text()
        },
        tried_in="tests/config/test_pair_name.py",
    ),
    # ---- the hub path's readers (data.dir=null): refused naming what went wrong, before any model loads --------
    BadInput(
        "hub_gated",
        "a gated hub dataset whose terms the account has not accepted (or no login)",
        ("task=triviaqa data.dir=null",),
        "DataError",
        "cannot read dataset mandarjoshi/trivia_qa (unfiltered.nocontext) split 'validation' from the Hugging Face "
        "hub: {error}; it is gated: accept its terms at https://huggingface.co/datasets/mandarjoshi/trivia_qa with "
        "your account, then log in here with `hf auth login`",
        tool="hub reader",
        tried_in="tests/unit/test_hub_data.py",
    ),
    BadInput(
        "hub_config",
        "a config the hub dataset does not have",
        ("task=triviaqa data.dir=null task.eval.hub.name=unfiltered.nocontxt",),
        "DataError",
        "cannot read dataset mandarjoshi/trivia_qa (unfiltered.nocontxt) split 'validation' from the Hugging Face hub: "
        "BuilderConfig 'unfiltered.nocontxt' not found. Available: {configs}; check the task's hub source "
        "(task.eval.hub / task.fewshot.hub: path 'mandarjoshi/trivia_qa', name, split, revision)",
        tool="hub reader",
        tried_in="tests/unit/test_hub_data.py",
    ),
    BadInput(
        "hub_unreachable",
        "the hub out of reach (no network, or HF_HUB_OFFLINE=1 with nothing cached)",
        ("task=triviaqa data.dir=null",),
        "DataError",
        "cannot read dataset mandarjoshi/trivia_qa (unfiltered.nocontext) split 'validation' from the Hugging Face "
        "hub: {error}; the Hugging Face hub cannot be reached from here (no network, or HF_HUB_OFFLINE=1 with nothing "
        "cached for it). Without network access, point data.dir at a local copy (docs/data.md, 'Where data come "
        "from')",
        tool="hub reader",
        tried_in="tests/unit/test_hub_data.py",
    ),
    BadInput(
        "hub_flores_shape",
        "a FLORES split without FLORES+'s field text (the old facebook/flores, a script datasets >= 4 cannot run)",
        ("task=flores_en_de data.dir=null task.eval.hub.path=facebook/flores",),
        "DataError",
        "facebook/flores (eng_Latn) split 'devtest' has no field 'text' (its fields: {fields}): the FLORES reader "
        "reads FLORES+ (openlanguagedata/flores_plus); the original facebook/flores is a loading script, which "
        "datasets >= 4 cannot run",
        tool="hub reader",
        tried_in="tests/unit/test_hub_data.py",
    ),
    # ---- the Python API: refused before any model reads the prompt -----------------------------------------
    BadInput(
        "api_long_prompt",
        "a prompt longer than a model's context, to decode, decode_batch or decode_stream",
        ('ensemble.decode("word " * 9000)',),
        "ContextLengthError",
        "model {name}: a prompt has {tokens} tokens and decoding may add {reserve}, but the model's context holds "
        "{positions}",
        tool="Python API",
        slow=True,
        tried_in="tests/engine/test_behaviour.py",
    ),
    # ---- adafuse-lm-eval: --model_args, refused before any weights load; requests, before any decoding ------
    BadInput(
        "lm_eval_long_request",
        "a request whose context is longer than a model's",
        ('generate_until(("word " * 9000, {"until": ["\\n"]}))',),
        "ContextLengthError",
        "model {name}: a prompt has {tokens} tokens and decoding may add {reserve}, but the model's context holds "
        "{positions}",
        tool="adafuse-lm-eval",
        slow=True,
        tried_in="tests/integration/test_lm_eval.py",
    ),
    BadInput(
        "lm_eval_sampling",
        "a sampling request",
        ('generate_until(("Q:", {"until": ["\\n"], "do_sample": True}))',),
        "ConfigError",
        "do_sample=True asks for sampling, but every method here decodes greedily (AdaFuse's word choice is "
        "deterministic); set do_sample: false in the task's generation_kwargs",
        tool="adafuse-lm-eval",
        slow=True,
        tried_in="tests/integration/test_lm_eval.py",
    ),
    BadInput(
        "lm_eval_temperature",
        "a temperature without do_sample",
        ('generate_until(("Q:", {"until": ["\\n"], "temperature": 0.8}))',),
        "ConfigError",
        "temperature=0.8 asks for sampling, but every method here decodes greedily; set temperature: 0 (or "
        "do_sample: false) in the task's generation_kwargs",
        tool="adafuse-lm-eval",
        slow=True,
        tried_in="tests/integration/test_lm_eval.py",
    ),
    BadInput(
        "lm_eval_num_beams",
        "a generation argument the methods do not take",
        ('generate_until(("Q:", {"until": ["\\n"], "num_beams": 4}))',),
        "ConfigError",
        "generation argument(s) num_beams are not supported: the methods here take until, max_gen_toks and greedy "
        "decoding only",
        tool="adafuse-lm-eval",
        slow=True,
        tried_in="tests/integration/test_lm_eval.py",
    ),
    # ---- adafuse-lm-eval: --model_args, refused before any weights load -------------------------------------
    BadInput(
        "lm_eval_method",
        "an unknown method",
        ("method=adafus",),
        "UnknownNameError",
        "unknown method 'adafus'. Did you mean 'adafuse', 'adafuse_code'? Valid choices: adafuse, adafuse_code, "
        "deepen, llm_blender, single, sweetspan, unite",
        tool="adafuse-lm-eval",
    ),
    BadInput(
        "lm_eval_pair",
        "an unknown model pair",
        ("method=single,pair=tinyy",),
        "UnknownNameError",
        "unknown model pair 'tinyy'. Did you mean 'tiny'? Valid choices: llama_mistral, qwen_llama, small, tiny",
        tool="adafuse-lm-eval",
    ),
    BadInput(
        "lm_eval_model",
        "an unknown model",
        ("method=single,models=smollm2_135m+gemma3",),
        "UnknownNameError",
        "unknown model 'gemma3'. Did you mean 'gemma3_270m'? Valid choices: gemma3_270m, internlm3_8b_instruct, "
        "llama31_8b_instruct, mistral7b_instruct_v03, qwen25_coder_05b, qwen3_8b, smollm2_135m",
        tool="adafuse-lm-eval",
    ),
    BadInput(
        "lm_eval_knob",
        "an unknown knob",
        ("method=adafuse,taux=0.5",),
        "ConfigError",
        "method 'adafuse' has no setting 'taux'; its settings: branches, diversity, fixed_words, max_word_tokens, "
        "max_words, tau; the model's own: pair, models, batch_size, batch_exact, cache_dir, threads, device",
        tool="adafuse-lm-eval",
    ),
    BadInput(
        "lm_eval_pair_and_models",
        "both pair and models",
        ("method=single,pair=tiny,models=smollm2_135m",),
        "ConfigError",
        "give either pair=<conf/model_pair name> or models=<name>+<name>, not both",
        tool="adafuse-lm-eval",
    ),
    BadInput(
        "lm_eval_batch_size",
        "batch_size < 1",
        ("method=single,batch_size=0",),
        "ConfigError",
        "batch_size must be >= 1, got 0",
        tool="adafuse-lm-eval",
    ),
    BadInput(
        "lm_eval_tau",
        "a negative τΔ",
        ("method=adafuse,tau=-1.0",),
        "ConfigError",
        "tau must be >= 0 (tau > 1 means 'never confident'), got -1.0",
        tool="adafuse-lm-eval",
    ),
    # ---- adafuse-serve: a request refused before it reaches the engine (status, then OpenAI's error message) ----
    BadInput(
        "serve_no_key",
        "a request without the API key the server was started with (--api-key, $ADAFUSE_API_KEY)",
        ("POST /v1/completions without 'Authorization: Bearer <key>'",),
        "401",
        "this server needs an API key: send the header 'Authorization: Bearer <key>'",
        tool="adafuse-serve",
        tried_in="tests/integration/test_serve_faults.py",
    ),
    BadInput(
        "serve_body_too_large",
        "a body larger than --max-body-mb (default 32)",
        ("POST /v1/completions with a 40 MB body",),
        "413",
        "the body is larger than this server's bound of 33554432 bytes (--max-body-mb); a prompt longer than the "
        "models' contexts could not be read anyway",
        tool="adafuse-serve",
        tried_in="tests/integration/test_serve.py",
    ),
    BadInput(
        "serve_nested_json",
        "JSON nested deeper than the parser reads",
        ("[[[...]]], 100,000 deep",),
        "400",
        "the body is not JSON this server reads: it is nested too deep",
        tool="adafuse-serve",
        tried_in="tests/integration/test_serve.py",
    ),
    BadInput(
        "serve_surrogate",
        "a prompt holding half a surrogate pair (JSON can spell it, no model can read it)",
        ('{"prompt": "Hi \\ud800"}',),
        "400",
        "prompt is not Unicode text: surrogates not allowed at character 3",
        tool="adafuse-serve",
        tried_in="tests/integration/test_serve.py",
    ),
    BadInput(
        "serve_prompt_bytes",
        "a prompt longer in bytes than a model's context can hold, refused before any tokenizer reads it",
        ('{"prompt": "word " * 6000000}',),
        "400",
        "model 'smollm2_135m': a prompt of 30000000 bytes has more than {tokens} tokens (no token of the model stands "
        "for more than {longest} bytes of a prompt) and decoding may add {reserve}, but the model's context holds 8192",
        tool="adafuse-serve",
        tried_in="tests/integration/test_serve.py",
    ),
    # ---- python -m eval.report -----------------------------------------------------------------------------
    BadInput(
        "report_not_a_run",
        "a folder that is not a finished run",
        ("{dir}/nothing", "-o", "{dir}/report.html"),
        "DataError",
        "{dir}/nothing is not a finished run directory: it has no metrics.json (a run writes metrics.json once "
        "every example has a prediction; scripts/merge.py writes it for shards)",
        tool="eval.report",
        files={"nothing/predictions.jsonl": ""},
    ),
    BadInput(
        "report_corrupt_metrics",
        "a run whose metrics.json is not JSON",
        ("{dir}/run", "-o", "{dir}/report.html"),
        "DataError",
        "{dir}/run/metrics.json is not valid JSON (Expecting ',' delimiter: line 1 column 23 (char 22)): rerun the "
        "run's command, or python scripts/merge.py {dir}/run, to write it again",
        tool="eval.report",
        setup="committed_run",
        files={"run/metrics.json": '{"task": "nq", "n": 10'},
    ),
    BadInput(
        "report_no_folder",
        "-o into a folder that does not exist",
        ("{dir}/run", "-o", "{dir}/missing/report.html"),
        "ConfigError",
        "-o {dir}/missing/report.html: the folder {dir}/missing does not exist; create it or choose another -o",
        tool="eval.report",
        setup="committed_run",
    ),
    BadInput(
        "report_output_is_folder",
        "-o naming a folder",
        ("{dir}/run", "-o", "{dir}"),
        "ConfigError",
        "-o {dir} is a folder; name the HTML file to write, e.g. -o {dir}/report.html",
        tool="eval.report",
        setup="committed_run",
    ),
]


# ---- the table of docs/configuration.md ----------------------------------------------------------------------


def table() -> str:
    """Markdown: one row per case, in this list's order."""

    def text(cell: str) -> str:  # as Markdown shows it: backslashes and angle brackets kept, no cell ended early
        return cell.replace("\\", "\\\\").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")

    lines = ["| tool | bad input | how | error | message |", "|---|---|---|---|---|"]
    for case in CASES:
        how = " ".join(case.args).replace("|", "\\|")  # a code span keeps the rest as it is
        lines.append(f"| {case.tool} | {text(case.what)} | `{how}` | `{case.error}` | {text(case.message)} |")
    return "\n".join(lines)
