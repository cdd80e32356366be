"""Fixtures: a real `corral serve` in front of real `corral sim` nodes, and `corral demo`."""
import os
import re
import socket
import subprocess
import tempfile
import threading
import queue

import pytest

# litellm (a client under test) fetches its model cost map from GitHub at import unless told not
# to; the suite talks to loopback only.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")


_connect = socket.socket.connect


def _loopback_only(self, address):
    """Every client library under test talks to Corral on loopback; a connect anywhere else is a
    test bug (or a library phoning home), so it fails loudly instead of reaching the Internet."""
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        if host not in ("127.0.0.1", "::1", "localhost") and not host.startswith("127."):
            raise OSError(f"tests/python talks to loopback only; refused a connect to {address!r}")
    return _connect(self, address)


socket.socket.connect = _loopback_only

BIN = os.environ.get("CORRAL_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "target", "debug", "corral")


class Proc:
    """A corral process whose output lines are collected; killed at teardown."""

    def __init__(self, *args):
        env = dict(os.environ, NO_COLOR="1", CORRAL_LOG="info")
        self.p = subprocess.Popen([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            self.seen.append(line)
            self.lines.put(line)

    def last_line_with(self, needle):
        return [l for l in self.seen if needle in l][-1]

    def urls(self, needle, count=1, timeout=30):
        found = []
        while len(found) < count:
            line = self.lines.get(timeout=timeout)
            if needle in line:
                found.append(re.search(r"http://[0-9.:]+", line).group(0))
        return found

    def stop(self):
        self.p.kill()
        self.p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sims():
    proc = Proc("sim", "--nodes", "3", "--port", "0", "--tps", "0", "--ttft-ms", "5")
    urls = proc.urls("simulated Ollama node on", count=3)
    yield urls
    proc.stop()


def _serve_over(sims, extra=""):
    tmp = tempfile.mkdtemp(prefix="corral-py-")
    cfg = f"[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\npath = \"{tmp}/corral.db\"\n\n{extra}"
    for i, url in enumerate(sims):
        cfg += f"[[nodes]]\nname = \"gpu{i}\"\nurl = \"{url}\"\n\n"
    path = os.path.join(tmp, "corral.toml")
    with open(path, "w") as f:
        f.write(cfg)
    proc = Proc("serve", "--config", path)
    (url,) = proc.urls("serving the Ollama API on")
    return proc, url


@pytest.fixture(scope="module")
def served(sims):
    """`corral serve` over the module's three sims (named gpu0..gpu2), for tests that look at
    what the sims received. Yields the broker URL."""
    proc, url = _serve_over(sims)
    yield url
    proc.stop()


@pytest.fixture(scope="module", params=["serve", "demo"])
def corral(request, sims):
    """Base URL of a running broker: `corral serve` over three sims, or `corral demo`."""
    if request.param == "serve":
        proc, url = _serve_over(sims)
    else:
        proc = Proc("demo", "--port", "0", "--admin-port", "0", "--db", os.path.join(tempfile.mkdtemp(prefix="corral-py-"), "demo.db"))
        (url,) = proc.urls("Ollama API:")
    yield url
    proc.stop()


def write_config(body):
    """A config file with free loopback addresses and a store of its own, plus `body`."""
    tmp = tempfile.mkdtemp(prefix="corral-py-")
    cfg = f"[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\npath = \"{tmp}/corral.db\"\n\n" + body
    path = os.path.join(tmp, "corral.toml")
    with open(path, "w") as f:
        f.write(cfg)
    return path


@pytest.fixture(scope="session")
def fallback():
    """`corral serve` whose only node is down, with a simulated OpenAI-compatible cloud that
    `default` may fall back to. Yields (broker URL, cloud sim URL)."""
    cloud = Proc("sim", "--port", "0", "--cloud", "--models", "gpt-4o-mini", "--tps", "0", "--ttft-ms", "0")
    (cloud_url,) = cloud.urls("simulated Ollama node on")
    path = write_config(
        f"[[nodes]]\nname = \"gpu0\"\nurl = \"http://127.0.0.1:{free_port()}\"\n\n"
        "[[categories]]\nname = \"default\"\ncloud = \"on-failure\"\nproviders = [\"cloudsim\"]\n\n"
        "[[categories]]\nname = \"hr\"\ncloud = \"never\"\n\n"
        f"[[providers]]\nname = \"cloudsim\"\nbase_url = \"{cloud_url}/v1\"\nmodel_map = {{ \"*\" = \"gpt-4o-mini\" }}\n"
    )
    proc = Proc("serve", "--config", path)
    (url,) = proc.urls("serving the Ollama API on")
    yield url, cloud_url
    proc.stop()
    cloud.stop()


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.fixture(scope="session")
def llamacpp():
    """`corral serve` whose only node is a real llama.cpp server (kind = "openai") running a
    generated tiny model (fixtures/make_tiny_gguf.py, served by fixtures/serve_xllamacpp.py from
    the xllamacpp wheel in requirements.txt). Yields the broker URL."""
    import sys

    tmp = tempfile.mkdtemp(prefix="corral-llm-")
    model = os.path.join(tmp, "tiny.gguf")
    subprocess.run([sys.executable, os.path.join(FIXTURES, "make_tiny_gguf.py"), model], check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, os.path.join(FIXTURES, "serve_xllamacpp.py"), model, "--port", str(port), "--alias", "tiny", "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import time
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError("llama.cpp server did not come up")
        time.sleep(0.1)
    path = write_config(f"[[nodes]]\nname = \"llama\"\nurl = \"http://127.0.0.1:{port}\"\nkind = \"openai\"\n")
    proc = Proc("serve", "--config", path)
    (url,) = proc.urls("serving the Ollama API on")
    yield url
    proc.stop()
    server.kill()
    server.wait()


def sim_received(urls):
    """Every request the sims at `urls` recorded (`/_sim/received`), in one list."""
    import json
    import urllib.request

    seen = []
    for u in urls:
        with urllib.request.urlopen(f"{u}/_sim/received", timeout=5) as r:
            seen.extend(json.load(r))
    return seen
