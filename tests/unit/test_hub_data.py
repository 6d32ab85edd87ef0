"""The hub path of every benchmark, without the hub: its repositories in their hub shape (tests/support/hub_shapes.py,
built from ../shared/data), read by `datasets` as it reads the hub's. What the hub is asked (which commit a
revision names) is answered by a stand-in for `HfApi.repo_info`, the one call to the hub's API a read makes."""

import hashlib
import shutil
from types import SimpleNamespace

import datasets
import httpx2
import pyarrow.parquet as pq
import pytest
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled
from omegaconf import OmegaConf

from adafuse.errors import DataError, ModelFileError
from conf.compose import compose_run
from conf.schema import DataConf
from eval.data import Sources, read_hub
from eval.hub import hub_commit
from eval.tasks import Task
from tests.support.bad_inputs import bad_input, pattern
from tests.support.hub_shapes import build

LOAD_DATASET = datasets.load_dataset


def commit_of(repo: str, revision: str) -> str:
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


@pytest.fixture(scope="module")
def repositories(tmp_path_factory):
    return build(tmp_path_factory.mktemp("hub"))


@pytest.fixture
def hub(repositories, monkeypatch, tmp_path):
    """The hub as the readers meet it: `repo_info` names a commit per revision, and `load_dataset` of a hub id
    reads the repository's folder (`hub.folders`), at the commit it was asked for. `hub.asked` lists (repo,
    revision) asked, `hub.loaded` (repo, config, split, revision) loaded."""
    state = SimpleNamespace(asked=[], loaded=[], folders=dict(repositories))

    def repo_info(self, repo_id, *, revision=None, repo_type=None, **kwargs):
        assert repo_type == "dataset"
        state.asked.append((repo_id, revision))
        return SimpleNamespace(sha=commit_of(repo_id, revision))

    def load_dataset(path, name=None, *, split=None, revision=None):
        state.loaded.append((path, name, split, revision))
        return LOAD_DATASET(str(state.folders[path]), name, split=split, cache_dir=str(tmp_path / "datasets"))

    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return state


def task(name: str, data_dir, *overrides: str) -> Task:
    cfg = compose_run(f"task={name}", "task.limit=null", *overrides)
    return Task(OmegaConf.to_object(cfg.task), DataConf(dir=None if data_dir is None else str(data_dir)))


def tried(key: str, folder) -> DataError:
    """The error a case of tools/bad_inputs.py (`task=... data.dir=null ...`) is refused with, held to its message."""
    case = bad_input(key)
    name, *overrides = case.args[0].split()
    with pytest.raises(DataError) as refused:
        task(name.removeprefix("task="), None, *(o for o in overrides if o != "data.dir=null"))
    assert pattern(case.message, folder).fullmatch(str(refused.value)), str(refused.value)
    return refused.value


def as_read(t: Task) -> list[tuple]:
    return [(e.id, e.fields, e.references) for e in t.examples]


@pytest.mark.parametrize("name", ["nq", "triviaqa", "gsm8k", "flores_en_de", "flores_de_en"])
def test_a_hub_split_gives_the_examples_and_ids_its_local_copy_gives(name, hub, shared_data):
    """The same questions under the same ids from either source (TriviaQA's too: not the hub's question_id, which
    the local file lacks), so that runs from the two can be compared by id."""
    from_hub, local = task(name, None), task(name, shared_data)
    assert as_read(from_hub) == as_read(local)
    assert len(from_hub.shots) == from_hub.cfg.num_fewshot


def test_squad_from_the_hub_scores_the_article_the_local_path_keeps_for_exemplars(hub, shared_data):
    from_hub, local = task("squad", None), task("squad", shared_data)
    local_ids = [e.id for e in local.examples]
    assert [e.id for e in from_hub.examples][: len(local_ids)] == local_ids
    assert len(from_hub.examples) - len(local_ids) == 206  # the "Force" article, scored only from the hub
    assert as_read(from_hub)[: len(local_ids)] == as_read(local)


def test_a_hub_read_records_the_commit_its_revision_names_and_reads_that_commit(hub):
    t = task("gsm8k", None, "task.eval.hub.revision=v1.0")
    assert ("openai/gsm8k", "v1.0") in hub.asked and ("openai/gsm8k", "main") in hub.asked  # eval, then few-shot
    recorded = t.sources.record()
    assert recorded["local"] is None and recorded["files"] == {}
    assert recorded["hub"] == [
        {"dataset": "openai/gsm8k", "config": "main", "split": split, "revision": revision, "commit": commit}
        for split, revision in (("test", "v1.0"), ("train", "main"))
        for commit in [commit_of("openai/gsm8k", revision)]
    ]
    # what was loaded is the commit, not the branch: a branch that moves meanwhile cannot mix two versions
    assert [loaded[3] for loaded in hub.loaded] == [h["commit"] for h in recorded["hub"]]


def test_a_commit_as_the_revision_is_read_as_it_is(hub):
    commit = "0123456789abcdef0123456789abcdef01234567"
    sources = Sources()
    read_hub(
        {
            "reader": "nq_hub",
            "path": "google-research-datasets/nq_open",
            "split": "validation",
            "prefix": "nq",
            "revision": commit,
        },
        sources,
    )
    assert hub.asked == [] and sources.hub[0]["commit"] == commit


def test_a_local_read_records_each_file_and_its_checksum(shared_data):
    t = task("nq", shared_data)
    recorded = t.sources.record()
    assert recorded["local"] == str(shared_data.resolve()) and recorded["hub"] == []
    files = {"nq_open/NQ-open.dev.jsonl", "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"}
    assert recorded["files"] == {
        name: hashlib.sha256((shared_data / name).read_bytes()).hexdigest() for name in sorted(files)
    }


def test_flores_reads_flores_plus_and_refuses_rows_in_another_shape(hub, tmp_path):
    """The original facebook/flores (a loading script, which datasets >= 4 cannot run) named its field `sentence`:
    a split in that shape is refused, naming what the reader reads, rather than read as None."""
    recorded = task("flores_en_de", None).sources.record()["hub"]
    assert {(h["dataset"], h["config"]) for h in recorded} == {
        ("openlanguagedata/flores_plus", "eng_Latn"),
        ("openlanguagedata/flores_plus", "deu_Latn"),
    }
    renamed = shutil.copytree(hub.folders["openlanguagedata/flores_plus"], tmp_path / "flores")
    for table in (renamed / "eng_Latn").glob("*.parquet"):
        rows = pq.read_table(table)
        pq.write_table(rows.rename_columns(["sentence" if c == "text" else c for c in rows.column_names]), table)
    hub.folders["facebook/flores"] = renamed
    tried("hub_flores_shape", tmp_path)


def gated(self, repo_id, **kwargs):
    request = httpx2.Request("GET", f"https://huggingface.co/api/datasets/{repo_id}")
    raise GatedRepoError(f"Access to dataset {repo_id} is restricted.", response=httpx2.Response(401, request=request))


def test_hub_errors_say_what_went_wrong_and_what_to_do(hub, monkeypatch, tmp_path):
    """Only a hub that cannot be reached gets the network hint: a gated dataset says to accept its terms and log in,
    a config the dataset lacks lists those it has."""
    typo = str(tried("hub_config", tmp_path))
    assert "['rc.nocontext', 'unfiltered.nocontext']" in typo and "network" not in typo
    spec = {"reader": "trivia_hub", "path": "mandarjoshi/trivia_qa", "split": "validation", "prefix": "tqa"}
    with pytest.raises(DataError, match='Unknown split "valid"') as split:
        read_hub({**spec, "name": "unfiltered.nocontext", "split": "valid"})
    assert "network" not in str(split.value)

    monkeypatch.setattr(HfApi, "repo_info", gated)
    assert "network" not in str(tried("hub_gated", tmp_path))

    def offline(self, repo_id, **kwargs):
        raise OfflineModeIsEnabled("Cannot reach the hub: offline mode is enabled.")

    monkeypatch.setattr(HfApi, "repo_info", offline)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    tried("hub_unreachable", tmp_path)


def test_offline_the_commit_is_the_one_the_local_hub_cache_recorded(monkeypatch, tmp_path):
    """As huggingface_hub lays its cache out: refs/<revision> holds the commit each download resolved it to."""
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    repo = tmp_path / "datasets--openai--gsm8k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "README.md").write_text("---\n---\n")
    (repo / "blobs").mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub_commit("openai/gsm8k", "main", "dataset") == commit
    with pytest.raises(OfflineModeIsEnabled):
        hub_commit("openai/gsm8k", "v2", "dataset")  # a revision the cache never saw


def test_a_hub_model_is_recorded_at_the_commit_its_revision_names_and_loads_that_commit(monkeypatch, tmp_path):
    from adafuse import model_config
    from eval.runner import model_sources, pinned

    def repo_info(self, repo_id, *, revision=None, repo_type=None, **kwargs):
        assert repo_type == "model"
        return SimpleNamespace(sha=commit_of(repo_id, revision))

    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    (tmp_path / "mistral").mkdir()
    llama, smol = model_config("llama31_8b_instruct"), model_config("smollm2_135m")
    mistral = model_config({**vars(model_config("mistral7b_instruct_v03")), "path": str(tmp_path / "mistral")})
    assert llama.revision == "main"  # every hub model's config names its revision
    sources = model_sources([llama, mistral, smol])
    assert sources == [
        {"name": llama.name, "hub": llama.path, "revision": "main", "commit": commit_of(llama.path, "main")},
        {"name": mistral.name, "path": str(tmp_path / "mistral"), "sha256": None},
        {"name": smol.name, "bundle": "smollm2_135m", "sha256": smol.sha256},
    ]
    loaded = pinned([llama, mistral, smol], [0, 1, 2], sources)
    assert loaded[0].revision == commit_of(llama.path, "main") and loaded[1:] == [mistral, smol]

    monkeypatch.setattr(HfApi, "repo_info", gated)
    with pytest.raises(ModelFileError, match="it is gated: accept its terms at https://huggingface.co/meta-llama"):
        model_sources([llama])
