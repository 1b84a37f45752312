"""A stand-in for the Hugging Face Hub: as much of its HTTP API as huggingface_hub's ``model_info`` and
``hf_hub_download`` use, over repositories held in memory. huggingface_hub is pointed at it with HF_ENDPOINT.

- ``GET /api/models/{org}/{name}[/revision/{revision}]``: the repository's commit and files (404 with
  ``X-Error-Code: RepoNotFound`` or ``RevisionNotFound`` as the Hub answers);
- ``HEAD``/``GET /{org}/{name}/resolve/{revision}/{path}``: a file, with the Hub's ``X-Repo-Commit`` and
  ``ETag`` headers; a gated repository answers 401 ``GatedRepo`` without its token. A file can be made to stall
  (half its bytes, then silence) or to break off (half its bytes, then the connection closed).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Revision:
    commit: str
    files: dict[str, bytes]


@dataclass
class Repository:
    revisions: dict[str, Revision] = field(default_factory=dict)  # branch or tag → revision
    token: str | None = None  # gated: files only with this token


class StandInHub:
    def __init__(self) -> None:
        self.repositories: dict[str, Repository] = {}
        self.stalling: set[str] = set()  # file paths that stall half-way
        self.breaking: set[str] = set()  # file paths whose connection closes half-way
        self.downloads: Counter[str] = Counter()  # "repo/path" → GETs of the file's bytes
        self.requests = 0  # every request answered
        self.failing: int | None = None  # a status every request is answered with (a Hub that is down: 503)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: str, files: dict[str, bytes], revision: str = "main", token: str | None = None) -> str:
        """Put ``files`` in ``repo`` at ``revision`` (a branch or tag); its commit hash."""
        commit = hashlib.sha1(repo.encode() + revision.encode() + b"".join(sorted(files.values()))).hexdigest()
        repository = self.repositories.setdefault(repo, Repository())
        repository.revisions[revision] = Revision(commit, files)
        repository.token = token
        return commit

    def add_directory(
        self, repo: str, directory: Path, revision: str = "main", extra: dict[str, bytes] | None = None
    ) -> str:
        """The files of ``directory`` (and ``extra``, path → bytes) as ``repo`` at ``revision``."""
        files = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
        return self.add(repo, files | (extra or {}), revision)

    def find(self, repo: str, revision: str) -> Revision | None:
        repository = self.repositories[repo]
        if revision in repository.revisions:
            return repository.revisions[revision]
        return next((r for r in repository.revisions.values() if r.commit == revision), None)

    def __enter__(self) -> StandInHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def refuse(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def do_GET(self) -> None:
                self.answer(body=True)

            def answer(self, body: bool) -> None:
                hub.requests += 1
                if hub.failing is not None:
                    return self.refuse(hub.failing, "", "Service Unavailable")
                parts = [unquote(part) for part in urlsplit(self.path).path.strip("/").split("/")]
                api = parts[:2] == ["api", "models"]
                if api:
                    parts = parts[2:]
                repo = "/".join(parts[:2])
                if repo not in hub.repositories:
                    return self.refuse(404, "RepoNotFound", "Repository not found")
                if api:
                    revision_name = parts[3] if len(parts) >= 4 and parts[2] == "revision" else "main"
                    revision_name = "/".join(parts[3:]) if len(parts) > 4 else revision_name
                    return self.model_info(repo, revision_name)
                if len(parts) < 5 or parts[2] != "resolve":
                    return self.refuse(404, "EntryNotFound", "Entry not found")
                revision_name, path = parts[3], "/".join(parts[4:])
                if revision_name.startswith("refs") and len(parts) > 6:  # refs/pr/N, unquoted
                    revision_name, path = "/".join(parts[3:6]), "/".join(parts[6:])
                self.file(repo, revision_name, path, body)

            def model_info(self, repo: str, revision_name: str) -> None:
                revision = hub.find(repo, revision_name)
                if revision is None:
                    return self.refuse(404, "RevisionNotFound", f"Invalid rev id: {revision_name}")
                gated = "manual" if hub.repositories[repo].token else False
                info = {
                    "id": repo,
                    "modelId": repo,
                    "sha": revision.commit,
                    "private": False,
                    "gated": gated,
                    "disabled": False,
                    "tags": [],
                    "siblings": [{"rfilename": name, "size": len(data)} for name, data in revision.files.items()],
                }
                data = json.dumps(info).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def file(self, repo: str, revision_name: str, path: str, body: bool) -> None:
                repository = hub.repositories[repo]
                if repository.token and self.headers.get("Authorization") != f"Bearer {repository.token}":
                    return self.refuse(401, "GatedRepo", "Access to model is restricted, you must be authenticated")
                revision = hub.find(repo, revision_name)
                if revision is None:
                    return self.refuse(404, "RevisionNotFound", f"Invalid rev id: {revision_name}")
                if path not in revision.files:
                    return self.refuse(404, "EntryNotFound", f"{path} does not exist")
                data = revision.files[path]
                self.send_response(200)
                self.send_header("X-Repo-Commit", revision.commit)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if not body:
                    return
                hub.downloads[f"{repo}/{path}"] += 1
                if path in hub.stalling or path in hub.breaking:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if path in hub.stalling:
                        time.sleep(8)
                    self.close_connection = True
                    return
                self.wfile.write(data)

        return Handler
