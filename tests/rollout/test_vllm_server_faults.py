"""Faults on the vLLM server path, without vLLM: a stand-in HTTP server that answers `/health/` and
`/info/` like `rlhfkit vllm-serve`, then goes silent or away. (The real engine dying mid-run is
tests/trainers/test_vllm_server_loss.py.)"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rlhfkit.rollout import SamplingParams, pad_left
from rlhfkit.rollout.vllm_client import VLLMServerBackend, VLLMServerLost
from rlhfkit.testing import tiny_model


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self._answer({"status": "ok"} if self.path.startswith("/health") else self.server.info)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append(self.path)
        time.sleep(self.server.silent_for)  # a busy or hung engine
        self._answer({"loaded_files": 1})

    def _answer(self, obj):
        with contextlib.suppress(OSError):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    """A stand-in server for the tiny Llama: `.posts` records the POSTed paths, `.silent_for` delays them."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    config = tiny_model("llama").config
    httpd.info = {"model": "tiny", "architectures": ["LlamaForCausalLM"], "vocab_size": config.vocab_size}
    httpd.posts, httpd.silent_for, httpd.daemon_threads = [], 0.0, True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(httpd) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def _generate(backend):
    ids, mask = pad_left([torch.tensor([5, 6, 7])], 0)
    return backend.generate(ids, mask, SamplingParams(max_new_tokens=3))


def test_a_server_silent_past_the_request_timeout_is_lost_with_what_to_do(server):
    backend = VLLMServerBackend(tiny_model("llama"), 0, base_url=_url(server), request_timeout=0.5)
    server.silent_for = 3.0
    start = time.monotonic()
    with pytest.raises(VLLMServerLost, match="stopped answering while sampling") as err:
        _generate(backend)
    assert time.monotonic() - start < 2.5  # the timeout, not the server's 3 s
    message = str(err.value)
    assert _url(server) in message and "resume_from_checkpoint" in message and "vllm-serve" in message
    with pytest.raises(VLLMServerLost, match="while loading the policy's weights"):
        backend.sync_weights()


def test_a_server_that_is_gone_is_lost_at_once(server):
    backend = VLLMServerBackend(tiny_model("llama"), 0, base_url=_url(server), request_timeout=60)
    server.shutdown()
    server.server_close()  # connections are now refused
    start = time.monotonic()
    with pytest.raises(VLLMServerLost, match=_url(server)):
        _generate(backend)
    with pytest.raises(VLLMServerLost, match="weights"):
        backend.sync_weights()
    assert time.monotonic() - start < 5  # refused: no waiting for the 60 s timeout


def test_a_non_positive_request_timeout_is_refused(server):
    with pytest.raises(ValueError, match="request_timeout must be > 0 seconds, got 0"):
        VLLMServerBackend(tiny_model("llama"), 0, base_url=_url(server), request_timeout=0)


def test_only_the_sending_process_posts_weights_and_every_process_joins_the_gathering(server):
    entered = []

    @contextlib.contextmanager
    def gathering():
        entered.append(1)
        yield

    model = tiny_model("llama")
    quiet = VLLMServerBackend(model, 0, base_url=_url(server), weights_context=gathering, sends_weights=False)
    quiet.sync_weights()
    assert server.posts == [] and entered == [1]
    VLLMServerBackend(model, 0, base_url=_url(server), weights_context=gathering).sync_weights()
    assert server.posts and server.posts[-1].endswith("last=true") and entered == [1, 1]
