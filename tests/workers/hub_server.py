"""A stand-in for the Hub's HTTP API on 127.0.0.1, for huggingface_hub's create_repo / create_branch /
upload_folder (the commit path without hf_xet): repositories become folders under ``root``, one per
revision, and every call is recorded. Point ``HF_ENDPOINT`` at ``url`` and set ``HF_HUB_DISABLE_XET=1``."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class HubServer:
    """Args:
        root: where the pushed files land: ``root/{namespace}/{name}/{revision}/{path}``.
        commit_delay: seconds each commit takes (a slow upload).
        fail_commits: how many commits to answer with HTTP 500 first.
    """

    user = "cadence-user"

    def __init__(self, root: Path, commit_delay: float = 0.0, fail_commits: int = 0):
        self.root, self.commit_delay, self.fail_commits = Path(root), commit_delay, fail_commits
        self.repos: list[dict] = []
        self.branches: list[tuple[str, str]] = []
        self.commits: list[dict] = []  # {"repo", "revision", "message", "files", "time"}
        self.unknown: list[str] = []
        self.authorizations: set[str | None] = set()  # the Authorization headers seen
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _json(self, code: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                with server.lock:
                    server.authorizations.add(self.headers.get("Authorization"))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                if parts == ["api", "repos", "create"]:
                    payload = json.loads(body)
                    repo_id = f"{payload.get('organization') or server.user}/{payload['name']}"
                    with server.lock:
                        server.repos.append({"repo_id": repo_id, **payload})
                    return self._json(200, {"url": f"{server.url}/{repo_id}"})
                if parts == ["api", "validate-yaml"]:
                    return self._json(200, {})
                if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "branch":
                    with server.lock:
                        server.branches.append((f"{parts[2]}/{parts[3]}", parts[5]))
                    return self._json(200, {})
                if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                      for f in files]})
                if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
                    return self._commit(f"{parts[2]}/{parts[3]}", parts[5], body)
                with server.lock:
                    server.unknown.append(f"POST {self.path}")
                return self._json(404, {"error": f"unknown endpoint {self.path}"})

            def do_GET(self):
                with server.lock:
                    server.unknown.append(f"GET {self.path}")
                return self._json(404, {"error": f"unknown endpoint {self.path}"})

            def _commit(self, repo_id: str, revision: str, body: bytes):
                time.sleep(server.commit_delay)
                with server.lock:
                    if server.fail_commits > 0:
                        server.fail_commits -= 1
                        server.commits.append({"repo": repo_id, "revision": revision, "failed": True})
                        return self._json(500, {"error": "the stand-in Hub fails this commit on purpose"})
                header, files = None, {}
                for line in body.decode().splitlines():
                    item = json.loads(line)
                    if item["key"] == "header":
                        header = item["value"]
                    elif item["key"] == "file":
                        files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                for path, content in files.items():
                    target = server.root / repo_id / revision / path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                oid = hashlib.sha1(body).hexdigest()
                with server.lock:
                    server.commits.append({"repo": repo_id, "revision": revision, "message": header["summary"],
                                           "files": sorted(files), "time": time.time(), "failed": False})
                return self._json(200, {"commitUrl": f"{server.url}/{repo_id}/commit/{oid}", "commitOid": oid,
                                        "pullRequestUrl": None})

        return Handler
