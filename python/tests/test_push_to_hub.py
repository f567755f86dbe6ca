"""push_to_hub speaks the hub's commit API as huggingface_hub itself does (issue 29): one recording fake hub
answers huggingface_hub's own upload_folder of a folder and a soltrain run's push of the same folder; the routes
they call, the shapes of what they send, and the files each commit carries agree. (huggingface_hub runs with
HF_HUB_DISABLE_XET=1: its LFS path, the one soltrain speaks; Xet storage is not built.)"""
import base64
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from conftest import BIN

TOKEN = "hf_push_test"


class FakeHub(http.server.ThreadingHTTPServer):
    """The write side of the hub: create, preupload (LFS for *.safetensors), LFS batch / PUT / verify, commit."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.calls = []  # (client, method, route, shape)
        self.blobs = {}
        self.commits = {}  # repo -> {path: bytes}
        self.client = "?"


def shape(value):
    """The keys of a JSON value, recursively (lists by their first element): what a request's body is made of."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def route(self, parts):
        # the repository's name out of the route, so two repositories' calls compare
        return "/".join("{repo}" if p in ("me", "ref", "a", "a.git") else p for p in parts)

    def do_PUT(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        parts = self.path.strip("/").split("/")
        self.server.calls.append((self.server.client, "PUT", self.route(parts[:1]), None))
        assert parts[0] == "upload" and hashlib.sha256(body).hexdigest() == parts[1]
        self.server.blobs[parts[1]] = body
        self.answer(200, b"", "text/plain")

    def do_POST(self):
        hub = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        parts = self.path.strip("/").split("?")[0].split("/")
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.answer(401, {"error": "no token"})
        if parts[-1] == "commit" or (len(parts) > 4 and parts[4] == "commit"):
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            hub.calls.append((hub.client, "POST", self.route(parts), [(x["key"], shape(x["value"])) for x in lines]))
            files = {}
            for x in lines:
                v = x["value"]
                if x["key"] == "file":
                    files[v["path"]] = base64.b64decode(v["content"])
                elif x["key"] == "lfsFile":
                    files[v["path"]] = hub.blobs[v["oid"]]
            hub.commits[f"{parts[2]}/{parts[3]}"] = files
            return self.answer(200, {"commitOid": "c" * 40, "commitUrl": f"{hub.url}/{parts[2]}/{parts[3]}/commit/c"})
        data = json.loads(body or b"{}")
        hub.calls.append((hub.client, "POST", self.route(parts), shape(data)))
        if parts == ["api", "validate-yaml"]:
            assert data["content"].startswith("---\n") and data["repoType"] == "model"
            return self.answer(200, {"errors": [], "warnings": []})
        if parts == ["api", "repos", "create"]:
            return self.answer(200, {"url": f"{hub.url}/{data.get('organization')}/{data['name']}"})
        if len(parts) > 4 and parts[4] == "preupload":
            hub.samples = getattr(hub, "samples", {})
            for f in data["files"]:
                hub.samples[(hub.client, f["path"])] = f["sample"]
            return self.answer(200, {"files": [
                {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular",
                 "shouldIgnore": False} for f in data["files"]]})
        if parts[-1] == "batch":
            return self.answer(200, {"transfer": "basic", "objects": [
                {"oid": o["oid"], "size": o["size"],
                 "actions": {"upload": {"href": f"{hub.url}/upload/{o['oid']}"},
                             "verify": {"href": f"{hub.url}/verify/{o['oid']}"}}} for o in data["objects"]]},
                kind="application/vnd.git-lfs+json")
        if parts[0] == "verify":
            return self.answer(200 if parts[1] in hub.blobs else 404, {})
        self.answer(404, {"error": "no such route"})


@pytest.fixture
def hub():
    server = FakeHub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_soltrain_pushes_what_huggingface_hub_pushes(demo, tmp_path, hub):
    pytest.importorskip("huggingface_hub")
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "home"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {demo / 'model'}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
                   f"output_dir: {tmp_path / 'out'}\nsequence_len: 64\nmax_steps: 2\nlora: true\nlora_rank: 4\n"
                   "hub_model_id: me/a\nhub_strategy: end\n")
    hub.client = "soltrain"
    r = subprocess.run([str(BIN), "sft", str(cfg)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    hub.client = "huggingface_hub"
    code = (f"from huggingface_hub import HfApi\napi = HfApi()\napi.create_repo('ref/a', exist_ok=True)\n"
            f"api.upload_folder(repo_id='ref/a', folder_path={str(tmp_path / 'out' / 'adapter')!r}, "
            f"commit_message='end of training (2 steps)', ignore_patterns=['.soltrain-output'])\n")
    # (.soltrain-output marks a folder soltrain wrote; soltrain pushes no dot-file)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]

    def calls(client):  # in order, a repeated call once (upload_folder checks the card's YAML twice)
        out = []
        for c in hub.calls:
            if c[0] == client and (not out or out[-1] != c[1:]):
                out.append(c[1:] if not isinstance(c[3], list) or not c[3] or isinstance(c[3][0], dict)
                           else (c[1], c[2], sorted(c[3], key=json.dumps)))  # commit lines: any order
        return out

    ours, theirs = calls("soltrain"), calls("huggingface_hub")
    assert [c[:2] for c in ours] == [c[:2] for c in theirs], "\n".join(map(str, ours)) + "\n---\n" + "\n".join(map(str, theirs))
    for (method, route, a), (_, _, b) in zip(ours, theirs):
        assert a == b, (method, route, a, b)
    # the same files, byte for byte, and the same samples the hub sniffs
    assert hub.commits["me/a"] == hub.commits["ref/a"]
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md"} <= set(hub.commits["me/a"])
    paths = {p for c, p in hub.samples}
    assert all(hub.samples[("soltrain", p)] == hub.samples[("huggingface_hub", p)] for p in paths)
