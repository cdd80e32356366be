"""A pull through Corral fans out to three nodes, one of which fails (it stopped listening after
Corral last probed it, as a crashed node does). ollama-py must read the progress to the end,
without an exception of its own, and report the failing node's error text; the two healthy
nodes must have the model when the client is done. tests/js/ollama.test.mjs checks ollama-js."""
import json
import urllib.request

import ollama
import pytest

from conftest import Proc, _serve_over

FAILING = "gpu2"


@pytest.fixture(scope="module")
def three_nodes_one_down():
    # 25 tokens/s: a pull's 14 progress lines take ~0.5 s per healthy node, so a client that stops
    # at the failing node's first line leaves the healthy pulls unfinished, every time.
    sims = Proc("sim", "--nodes", "3", "--port", "0", "--tps", "25", "--ttft-ms", "0")
    urls = sims.urls("simulated Ollama node on", count=3)
    # Probes far apart, so Corral still counts gpu2 available when the pull comes.
    proc, url = _serve_over(urls, "[health]\ninterval_ms = 600000\nfailures_to_down = 100\ndeep_interval_ms = 600000\n\n")
    with urllib.request.urlopen(f"{url}/api/tags", timeout=10) as r:
        json.load(r)
    down = urllib.request.Request(f"{urls[2]}/_sim/down", data=json.dumps({"for_ms": 120000}).encode(), method="POST")
    urllib.request.urlopen(down, timeout=5).close()
    yield url, urls
    proc.stop()
    sims.stop()


def has_model(sim_url, model):
    with urllib.request.urlopen(f"{sim_url}/api/tags", timeout=5) as r:
        return model in {m["name"] for m in json.load(r)["models"]}


def test_ollama_py_pull_to_three_nodes_one_failing(three_nodes_one_down):
    url, sims = three_nodes_one_down
    seen, error = [], None
    try:
        for p in ollama.Client(host=url).pull("corral-fanout-py", stream=True):
            seen.append(p)
    except ollama.ResponseError as e:  # Ollama's own way to end a failed pull: a last {"error": "..."} line
        error = e
    if error is not None:
        assert isinstance(error.error, str), f"the error is text, not {type(error.error).__name__}"
        text = error.error
    else:
        text = " ".join(p.status or "" for p in seen)
    assert FAILING in text, f"the failing node is named in what the client reports: {text!r}"
    assert seen and any(p.total for p in seen), "layer progress from the healthy nodes came first"
    for healthy in sims[:2]:
        assert has_model(healthy, "corral-fanout-py:latest"), (
            f"the client read to the end, so the pull on {healthy} finished (it saw {len(seen)} lines, then {text!r})")


def test_ollama_py_pull_to_three_healthy_nodes_reaches_every_node(sims, served):
    progress = list(ollama.Client(host=served).pull("corral-fanout-all", stream=True))
    assert progress[-1].status == "success"
    for sim in sims:
        assert has_model(sim, "corral-fanout-all:latest"), f"{sim} has the model when the client is done"
