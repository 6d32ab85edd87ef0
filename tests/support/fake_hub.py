"""A Hugging Face hub on the loopback, serving model folders under repository ids, for tests that download without
the network: `huggingface_hub` talks to it as it talks to huggingface.co once `HF_ENDPOINT` names it.

It answers what a download asks: a revision's commit (`/api/models/<id>/revision/<rev>`), the commit's file
tree (`/api/models/<id>/tree/<commit>`), and each file (`/<id>/resolve/<commit>/<path>`: a HEAD with the
commit, ETag and size headers, then the bytes). Each repository has one commit, named by a digest of its files,
which `main` and the commit itself resolve to; any other revision is a 404 in the hub's words. It counts the
file downloads (`downloads`), so a test can tell a download from a read of the cache.
"""

import hashlib
import json
import threading
from collections import Counter
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Repo:
    def __init__(self, folder: Path):
        self.files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        digest = hashlib.sha1()
        for name, path in self.files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
        self.commit = digest.hexdigest()

    def etag(self, name: str) -> str:
        return hashlib.sha256(self.files[name].read_bytes()).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, Path]):
        self.repos = {repo_id: Repo(folder) for repo_id, folder in repos.items()}
        self.downloads: Counter[str] = Counter()  # "<repo id>/<path>" -> GETs of its bytes
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the tests read what they need from `downloads`
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def commit(self, repo_id: str) -> str:
        return self.repos[repo_id].commit

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(request.path).path)
        if path.startswith("/api/models/"):
            owner, name, kind, revision = (path.removeprefix("/api/models/").split("/", 4) + [""] * 4)[:4]
            repo_id = f"{owner}/{name}"
            repo = self._repo(request, repo_id, revision)
            if repo is None:
                return
            if kind == "revision":
                siblings = [{"rfilename": name} for name in repo.files]
                self._json(request, {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "siblings": siblings})
            elif kind == "tree":
                tree = [
                    {"type": "file", "path": name, "size": p.stat().st_size, "oid": repo.etag(name)}
                    for name, p in repo.files.items()
                ]
                self._json(request, tree)
            else:
                self._error(request, 404, "EntryNotFound", f"no such API route {path}")
            return
        owner, name, resolve, revision, file = (path.lstrip("/").split("/", 4) + [""] * 5)[:5]
        repo = self._repo(request, f"{owner}/{name}", revision) if resolve == "resolve" else None
        if resolve != "resolve":
            self._error(request, 404, "EntryNotFound", f"no such route {path}")
        if repo is None:
            return
        if file not in repo.files:
            self._error(request, 404, "EntryNotFound", f"{file} is not in {owner}/{name}@{repo.commit}")
            return
        data = repo.files[file].read_bytes()
        request.send_response(200)
        request.send_header("X-Repo-Commit", repo.commit)
        request.send_header("ETag", f'"{repo.etag(file)}"')
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if body:
            self.downloads[f"{owner}/{name}/{file}"] += 1
            request.wfile.write(data)

    def _repo(self, request, repo_id: str, revision: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(request, 404, "RepoNotFound", f"Repository Not Found for url: {request.path}.")
        elif revision not in ("main", repo.commit):
            self._error(request, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo

    @staticmethod
    def _json(request, payload) -> None:
        data = json.dumps(payload).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    @staticmethod
    def _error(request, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        request.send_response(status)
        request.send_header("X-Error-Code", code)
        request.send_header("X-Error-Message", message)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)


@contextmanager
def serving(repos: dict[str, Path]):
    """A FakeHub serving `repos` (repository id -> folder) while the block runs."""
    hub = FakeHub(repos)
    thread = threading.Thread(target=hub.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.server.shutdown()
        hub.server.server_close()
