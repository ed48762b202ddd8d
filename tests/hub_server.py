"""A local HTTP server that answers the Hugging Face Hub endpoints `snapshot_download` calls.

Served from folders on disk, so a test can point `HF_ENDPOINT` at it and exercise the real download
path of `huggingface_hub` (repo info, tree listing, file metadata by HEAD, file by GET) without a
network. Endpoint shapes follow huggingface_hub 2.x (`HfApi.repo_info`, `HfApi.list_repo_tree`,
`get_hf_file_metadata`, `hf_hub_download`), for model repos and dataset repos (the latter as
`datasets.load_dataset` reads them: README, folder listings, data files under `data/`).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_KIND = r"(?P<kind>models|datasets)"
_INFO = re.compile(rf"^/api/{_KIND}/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/?]+))?(?:\?.*)?$")
_TREE = re.compile(rf"^/api/{_KIND}/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/?]+)(?P<sub>/[^?]*)?(?:\?.*)?$")
_FILE = re.compile(r"^/(?:datasets/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>[^?]+)(?:\?.*)?$")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _tree(folder: Path, names: list[str], sub: str, recursive: bool) -> list[dict[str, object]]:
    """`list_repo_tree` entries under `sub`: every file below it, or (not recursive) its direct
    files and folders, as `datasets` lists a repo's `data/` folder to find the splits' files."""
    prefix = f"{sub}/" if sub else ""
    entries: dict[str, dict[str, object]] = {}
    for name in names:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if not recursive and "/" in rest:
            directory = prefix + rest.split("/", 1)[0]
            entries[directory] = {"type": "directory", "path": directory, "oid": COMMIT}
            continue
        data = (folder / name).read_bytes()
        entries[name] = {
            "type": "file",
            "path": name,
            "size": len(data),
            "oid": hashlib.sha1(data).hexdigest(),
        }
    return list(entries.values())


class HubHandler(BaseHTTPRequestHandler):
    repos: dict[str, Path] = {}
    requested: list[str] = []

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def _json(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, code: str = "RepoNotFound") -> None:
        data = json.dumps({"error": "Repository not found" if code == "RepoNotFound" else "Entry not found"})
        data = data.encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(with_body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(with_body=True)

    def _serve(self, *, with_body: bool) -> None:
        self.requested.append(f"{self.command} {self.path}")
        if (match := _TREE.match(self.path)) or (match := _INFO.match(self.path)):
            folder = self.repos.get(match["repo"])
            if folder is None:
                return self._not_found()
            names = [p.relative_to(folder).as_posix() for p in _files(folder)]
            if match.re is _TREE:
                return self._json(
                    _tree(folder, names, (match["sub"] or "").strip("/"), "recursive=true" in self.path)
                )
            return self._json(
                {"id": match["repo"], "sha": COMMIT, "siblings": [{"rfilename": n} for n in names]}
            )
        match = _FILE.match(self.path)
        folder = self.repos.get(match["repo"]) if match else None
        file = folder / match["file"] if folder is not None and match else None
        if file is None or not file.is_file():
            # A file missing from a repo that exists (a dataset's README.md, say) is not a missing repo.
            return self._not_found("RepoNotFound" if folder is None else "EntryNotFound")
        data = file.read_bytes()
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if with_body:
            self.wfile.write(data)


@contextmanager
def serve_hub(repos: dict[str, Path]) -> Iterator[tuple[str, list[str]]]:
    """Serve `repos` (repo id -> folder) on localhost; yields (endpoint URL, list of requests seen)."""
    requested: list[str] = []
    handler = type("Handler", (HubHandler,), {"repos": repos, "requested": requested})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()
        server.server_close()
