"""A run directory shared by several processes: appends never interleave or repeat an example, a torn
line is dropped, and a shard has one writer at a time."""

import json
import multiprocessing
import os

import pytest

from adafuse.errors import ConfigError, ShardBusyError
from eval.results import RunDir, read_predictions

CONFIG = {"task": {"name": "nq", "limit": 4, "shard": 0, "num_shards": 1}, "method": {"name": "adafuse", "tau": 0.7}}


def record(example_id: str, writer: int) -> dict:
    # Long enough (about 70 kB) that one line takes several write() calls.
    return {"id": example_id, "writer": writer, "prediction": f"{writer}" * 70_000}


def write_examples(path, writer: int, ids: list[str], start=None) -> None:
    out = RunDir(path, CONFIG).admit()
    if start is not None:
        start.wait()
    for example_id in ids:
        out.append(record(example_id, writer))


def test_concurrent_writers_never_interleave_lines_or_write_an_example_twice(tmp_path):
    ids = [f"nq-{i}" for i in range(60)]
    fork = multiprocessing.get_context("fork")
    start = fork.Barrier(4)
    # Four processes, each writing every example: as if every shard had been given the whole task.
    writers = [fork.Process(target=write_examples, args=(tmp_path, w, ids, start)) for w in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join()
        assert p.exitcode == 0
    lines = (tmp_path / "predictions.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]  # every line parses: none interleaved
    assert sorted(r["id"] for r in records) == sorted(ids)
    assert all(r["prediction"] == f"{r['writer']}" * 70_000 for r in records)


def test_a_torn_last_line_is_ignored_then_cut_by_the_next_append(tmp_path):
    write_examples(tmp_path, 0, ["nq-0"])
    with open(tmp_path / "predictions.jsonl", "ab") as f:
        f.write(b'{"id": "nq-1", "predic')  # a writer killed mid-line
    out = RunDir(tmp_path, CONFIG).admit()
    assert set(out.records) == {"nq-0"} and set(read_predictions(tmp_path / "predictions.jsonl")) == {"nq-0"}
    out.append(record("nq-1", 1))
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["nq-0", "nq-1"]


def test_a_second_writer_of_a_shard_is_refused_and_names_the_first(tmp_path):
    first, second = RunDir(tmp_path, CONFIG), RunDir(tmp_path, CONFIG)
    with first.claim(1, 4):
        with pytest.raises(ShardBusyError, match=f"shard 1 of 4 is being decoded by pid {os.getpid()}"):
            with second.claim(1, 4):
                pass
        with second.claim(2, 4):  # another shard may write at the same time
            pass
    with second.claim(1, 4):  # free again once the first writer is done
        pass
    assert not list(tmp_path.glob(".shard-*")), "a claim's lock file outlived it"


def test_a_claimant_that_opened_the_lock_file_as_its_holder_removed_it_claims_the_file_under_the_name(
    tmp_path, monkeypatch
):
    """The holder removes its lock file while it still holds it; a second process may have opened that file just
    before. Once it holds it, that file has no name: it must not count as the claim, or a third process would
    claim the file created under the name meanwhile, and two would write the shard."""
    first, second, third = (RunDir(tmp_path, CONFIG) for _ in range(3))
    path = tmp_path / ".shard-0-of-1.lock"
    opened = []
    real_open = open

    def open_then_let_the_holder_finish(file, *args, **kwargs):
        handle = real_open(file, *args, **kwargs)
        if file == path and not opened:
            opened.append(handle)
            holding.__exit__(None, None, None)  # the holder ends its claim between this open and the flock
        return handle

    holding = first.claim(0, 1)
    holding.__enter__()
    monkeypatch.setattr("builtins.open", open_then_let_the_holder_finish)
    with second.claim(0, 1):
        monkeypatch.undo()
        assert path.exists()  # claimed under the name: the file it had opened was not it
        with pytest.raises(ShardBusyError):
            with third.claim(0, 1):
                pass


def test_records_written_by_another_writer_are_seen_after_refresh(tmp_path):
    mine = RunDir(tmp_path, CONFIG)
    write_examples(tmp_path, 1, ["nq-2", "nq-3"])
    assert mine.records == {}
    mine.refresh()
    assert set(mine.records) == {"nq-2", "nq-3"}


def test_shard_and_limit_may_change_between_writers_other_settings_may_not(tmp_path):
    write_examples(tmp_path, 0, ["nq-0"])
    RunDir(tmp_path, {**CONFIG, "task": {"name": "nq", "limit": 8, "shard": 3, "num_shards": 4}}).admit()
    RunDir(tmp_path, {**CONFIG, "results_dir": "/elsewhere"}).admit()  # also a run written before results_dir existed
    with pytest.raises(ConfigError, match="method.tau"):
        RunDir(tmp_path, {**CONFIG, "method": {"name": "adafuse", "tau": 0.5}}).admit()


def test_a_run_resumes_at_another_batch_size_only_when_batching_is_exact(tmp_path):
    exact, fast = tmp_path / "exact", tmp_path / "fast"
    RunDir(exact, {**CONFIG, "batch_size": 8, "batch_exact": True}).admit().append(record("nq-0", 0))
    RunDir(exact, {**CONFIG, "batch_size": 1, "batch_exact": True}).admit()  # outputs do not depend on it
    RunDir(fast, {**CONFIG, "batch_size": 8, "batch_exact": False}).admit().append(record("nq-0", 0))
    with pytest.raises(ConfigError, match="batch_size"):
        RunDir(fast, {**CONFIG, "batch_size": 1, "batch_exact": False}).admit()


def test_a_process_writes_nothing_before_it_is_admitted_and_a_refused_one_nothing_at_all(tmp_path):
    holder = RunDir(tmp_path, CONFIG).admit()
    config = (tmp_path / "config.yaml").stat()
    other = RunDir(tmp_path, {**CONFIG, "method": {"name": "adafuse", "tau": 1.5}})  # reads, writes nothing
    with pytest.raises(RuntimeError, match="only once admitted"):
        other.append(record("nq-0", 1))
    holder.append(record("nq-0", 0))  # config.yaml is still the one the holder was admitted under
    with pytest.raises(ConfigError, match="method.tau"):
        other.admit()
    assert (tmp_path / "config.yaml").stat().st_ino == config.st_ino
    assert [r["writer"] for r in read_predictions(tmp_path / "predictions.jsonl").values()] == [0]
