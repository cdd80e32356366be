"""The official Ollama and OpenAI Python clients, pointed at Corral, work unchanged."""
import json
import urllib.request

import ollama
import openai
import pytest


def test_ollama_lists_models(corral):
    names = {m.model for m in ollama.Client(host=corral).list().models}
    assert "llama3.2:latest" in names
    assert "nomic-embed-text:latest" in names


def test_ollama_chat(corral):
    r = ollama.Client(host=corral).chat(model="llama3.2", messages=[{"role": "user", "content": "hello"}])
    assert r.done is True
    assert r.message.role == "assistant"
    assert r.message.content
    assert r.eval_count and r.eval_count > 0


def test_ollama_chat_stream(corral):
    parts = list(ollama.Client(host=corral).chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert len(parts) >= 2
    assert parts[-1].done is True and parts[-1].done_reason == "stop"
    assert all(p.done is False for p in parts[:-1])
    assert "".join(p.message.content for p in parts)


def test_ollama_generate_honours_num_predict_and_seed(corral):
    c = ollama.Client(host=corral)
    a = c.generate(model="llama3.2", prompt="x", options={"num_predict": 4, "seed": 9})
    b = c.generate(model="llama3.2", prompt="x", options={"num_predict": 4, "seed": 9})
    assert a.eval_count == 4 and a.done_reason == "length"
    assert a.response == b.response


def test_ollama_embed(corral):
    r = ollama.Client(host=corral).embed(model="nomic-embed-text", input=["one", "two"])
    assert len(r.embeddings) == 2
    assert len(r.embeddings[0]) > 0


def test_ollama_show_and_ps(corral):
    c = ollama.Client(host=corral)
    s = c.show("llama3.2")
    assert "completion" in (s.capabilities or [])
    assert s.details.family == "llama"
    c.generate(model="llama3.2", prompt="warm up", options={"num_predict": 1})
    loaded = c.ps().models
    assert any(m.model == "llama3.2:latest" for m in loaded)


def test_ollama_unknown_model_is_a_404_response_error(corral):
    c = ollama.Client(host=corral)
    c.list()  # the broker learns every node's models from the merged answer
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404
    assert "no-such-model" in str(e.value)


def test_openai_chat(corral):
    c = openai.OpenAI(base_url=f"{corral}/v1", api_key="unused")
    r = c.chat.completions.create(model="llama3.2", messages=[{"role": "user", "content": "hello"}])
    assert r.choices[0].message.content
    assert r.usage.completion_tokens > 0


def test_openai_chat_stream(corral):
    c = openai.OpenAI(base_url=f"{corral}/v1", api_key="unused")
    chunks = list(c.chat.completions.create(model="llama3.2", messages=[{"role": "user", "content": "hello"}], stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_models_and_embeddings(corral):
    c = openai.OpenAI(base_url=f"{corral}/v1", api_key="unused")
    ids = {m.id for m in c.models.list()}
    assert "llama3.2:latest" in ids
    e = c.embeddings.create(model="nomic-embed-text", input="hello")
    assert len(e.data[0].embedding) > 0


def _sim_faults(url, faults):
    req = urllib.request.Request(f"{url}/_sim/faults", data=json.dumps(faults).encode(), method="POST", headers={"content-type": "application/json"})
    urllib.request.urlopen(req).close()


def test_ollama_client_sees_a_mid_stream_failure_as_an_error(sims):
    """A node that breaks off mid-answer surfaces as ResponseError, never as a finished answer."""
    from conftest import Proc
    import os, tempfile
    tmp = tempfile.mkdtemp(prefix="corral-py-")
    cfg = f"[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\npath = \"{tmp}/corral.db\"\n\n[[nodes]]\nname = \"only\"\nurl = \"{sims[0]}\"\n"
    path = os.path.join(tmp, "corral.toml")
    with open(path, "w") as f:
        f.write(cfg)
    proc = Proc("serve", "--config", path)
    try:
        (url,) = proc.urls("serving the Ollama API on")
        _sim_faults(sims[0], {"cut_after": 2})
        seen = []
        with pytest.raises(ollama.ResponseError) as e:
            for part in ollama.Client(host=url).chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], stream=True):
                seen.append(part)
        assert "incomplete" in str(e.value)
        assert len(seen) == 2 and not any(p.done for p in seen)
    finally:
        _sim_faults(sims[0], {})
        proc.stop()


def test_metrics_parse_with_the_prometheus_parser(tmp_path, sims):
    """/metrics is valid Prometheus text and counts what was served."""
    from conftest import Proc
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        f"[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\npath = \"{tmp_path}/c.db\"\n\n"
        f"[[nodes]]\nname = \"only\"\nurl = \"{sims[1]}\"\n"
    )
    proc = Proc("serve", "--config", str(cfg))
    try:
        (url,) = proc.urls("serving the Ollama API on")
        (admin,) = proc.urls("Admin API on")
        token = None
        # The token is printed on the same line as the admin URL.
        for _ in range(3):
            ollama.Client(host=url).chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}])
        import re, subprocess
        line = proc.last_line_with("Admin API on")
        token = re.search(r"token: (\w+)", line).group(1)
        req = urllib.request.Request(f"{admin}/metrics", headers={"Authorization": f"Bearer {token}"})
        text = urllib.request.urlopen(req).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        served = sum(s.value for s in families["corral_requests"].samples if s.labels.get("node") == "only" and s.labels.get("outcome") == "ok")
        assert served == 3
        assert "corral_time_to_first_byte_seconds" in families
        assert "corral_queue_depth" in families
    finally:
        proc.stop()
