"""scripts/prepare_data.py against a mirror on the loopback that holds each source file at its host and path: the
folder it builds holds ../shared/data's files (a .gz one decompressed to the same bytes), a rerun fetches only what
is not the pinned file, a source that is not the pinned file is refused, and the SentencePiece model lands where
spBLEU reads it."""

import functools
import gzip
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.paths import ROOT, SHARED_DATA
from tools.make_paper_pair import source

SPM = "dl.fbaipublicfiles.com/fairseq/models/flores/sacrebleu_tokenizer_spm.model"


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def mirror_of(folder: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """Every source file at <host>/<path>, with the bytes ../shared/data holds (decompressed where gzipped); a real
    SentencePiece model (Mistral's, from mistral-common) stands in for flores101's, which no machine here has."""
    from scripts.prepare_data import GITHUB, SOURCES

    root = tmp_path_factory.mktemp("mirror")
    for target, repo, commit, path, _ in SOURCES:
        out = root / GITHUB.split("://")[1] / repo / commit / path
        out.parent.mkdir(parents=True, exist_ok=True)
        raw = (SHARED_DATA / target).read_bytes()
        out.write_bytes(gzip.decompress(raw) if target.endswith(".gz") else raw)
    (root / SPM).parent.mkdir(parents=True)
    (root / SPM).write_bytes(source("mistral_v3_spm").read_bytes())
    return root


def prepare(data: Path, url: str, sacrebleu: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / "prepare_data.py"), str(data), "--mirror", url]
    env = os.environ | {"SACREBLEU": str(sacrebleu)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_the_data_folder_is_built_from_the_pinned_sources_and_a_rerun_fetches_nothing(mirror, tmp_path):
    from scripts.prepare_data import SOURCES, content

    with mirror_of(mirror) as url:
        done = prepare(tmp_path / "data", url, tmp_path / "sacrebleu")
        assert done.returncode == 0, done.stderr[-2000:]
        for target, *_ in SOURCES:
            assert content(tmp_path / "data" / target) == content(SHARED_DATA / target), target
        assert (tmp_path / "sacrebleu" / "models" / Path(SPM).name).read_bytes() == (mirror / SPM).read_bytes()
        assert f"export ADAFUSE_DATA_DIR={(tmp_path / 'data').resolve()}" in done.stdout

        (tmp_path / "data" / SOURCES[0][0]).write_text("edited\n")
        again = prepare(tmp_path / "data", url, tmp_path / "sacrebleu")
        assert again.returncode == 0, again.stderr[-2000:]
        states = dict(line.split(": ", 1) for line in again.stdout.splitlines()[: len(SOURCES)])
        assert states.pop(SOURCES[0][0]).startswith("fetched") and set(states.values()) == {"kept"}
        assert (tmp_path / "data" / SOURCES[0][0]).read_bytes() == (SHARED_DATA / SOURCES[0][0]).read_bytes()


def test_a_source_that_is_not_the_pinned_file_is_refused_and_nothing_is_written(mirror, tmp_path):
    from scripts.prepare_data import GITHUB, SOURCES

    target, repo, commit, path, sha256 = SOURCES[-1]
    served = mirror / GITHUB.split("://")[1] / repo / commit / path
    original = served.read_bytes()
    served.write_bytes(original + b"one more line\n")
    try:
        with mirror_of(mirror) as url:
            done = prepare(tmp_path / "data", url, tmp_path / "sacrebleu")
    finally:
        served.write_bytes(original)
    assert done.returncode != 0 and f"not the pinned {sha256}" in done.stderr
    assert not (tmp_path / "data" / target).exists()
