"""The Hugging Face hub as a run reads it: which commit a revision names, and what went wrong when it cannot.

A run records the commit every hub dataset and model it read resolved to (eval/runner.py), and then reads
that commit, not the branch: a branch that moves while a run starts (FLORES+ is still edited) cannot give
the run two versions. Offline (HF_HUB_OFFLINE=1, or no network), the commit is the one the local hub cache
recorded for the revision when its files were last downloaded.
"""

import re
import socket

from huggingface_hub import HfApi, constants, scan_cache_dir
from huggingface_hub.errors import (
    GatedRepoError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from adafuse.errors import DataError

COMMIT = re.compile(r"[0-9a-f]{40}")
LOGIN = "hf auth login"  # huggingface-hub >= 1 (its older CLI, huggingface-cli, is gone)


def hub_commit(repo_id: str, revision: str | None, repo_type: str) -> str:
    """The commit that `revision` (a branch, tag or commit; None: main) of a hub repository names now, asked of
    the hub; where the hub cannot be reached, the commit the local cache recorded for it. Raises the hub's
    error where neither knows it (`describe` words it)."""
    revision = revision or "main"
    if COMMIT.fullmatch(revision):
        return revision
    try:
        return HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type).sha
    except Exception as err:
        if not unreachable(err):
            raise
        cached = cached_commit(repo_id, revision, repo_type)
        if cached is None:
            raise
        return cached


def cached_commit(repo_id: str, revision: str, repo_type: str) -> str | None:
    """The commit the local hub cache recorded for `revision` of the repository (None if it holds none)."""
    try:
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos
    except Exception:  # noqa: BLE001 - no cache folder yet, or one this version cannot read: nothing cached
        return None
    for repo in repos:
        if repo.repo_id == repo_id and repo.repo_type == repo_type:
            for cached in repo.revisions:
                if revision in cached.refs:
                    return cached.commit_hash
    return None


def unreachable(err: BaseException) -> bool:
    """Did `err` (or an error it was raised from) come from not reaching the hub: offline mode, a refused or
    timed-out connection, a name that does not resolve?"""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OfflineModeIsEnabled | ConnectionError | TimeoutError | socket.gaierror):
            return True
        # the HTTP client's transport errors (httpx, or httpx2 under huggingface-hub 2), whichever it is
        if any(c.__name__ == "TransportError" and c.__module__.startswith("httpx") for c in type(err).__mro__):
            return True
        err = err.__cause__ or err.__context__
    return False


DATA_OFFLINE = "point data.dir at a local copy (docs/data.md, 'Where data come from')"


def describe(
    err: BaseException, what: str, url: str, where: str, offline: str = DATA_OFFLINE, error: type = DataError
) -> Exception:
    """An `error` (a DataError, or a ModelFileError for a model) for a hub read that failed, naming `what` (e.g.
    "dataset openai/gsm8k (main) split 'test'") and saying what to do for the kind of failure it was: `where`
    names the setting that points at it, `url` is the repository's page, `offline` what to do without network."""
    text = str(err)
    if unreachable(err):
        hint = (
            "the Hugging Face hub cannot be reached from here (no network, or HF_HUB_OFFLINE=1 with nothing cached "
            f"for it). Without network access, {offline}"
        )
    elif isinstance(err, GatedRepoError) or "gated" in text.lower():
        hint = f"it is gated: accept its terms at {url} with your account, then log in here with `{LOGIN}`"
    elif isinstance(err, RevisionNotFoundError):
        hint = f"it has no such revision; check {where}'s revision (a branch, tag or commit of {url})"
    elif isinstance(err, RepositoryNotFoundError) or type(err).__name__ == "DatasetNotFoundError":
        hint = f"no such repository, or a private one your login cannot read: check {where}"
    else:  # a config or split it does not have, a file it cannot parse: the library's own words name it
        hint = f"check {where}"
    return error(f"cannot read {what} from the Hugging Face hub: {text.strip() or type(err).__name__}; {hint}")
