"""The official clients work unchanged while the cluster is down and a cloud answers."""
import json
import urllib.error
import urllib.request

import ollama
import openai
import pytest


def test_ollama_chat_falls_back(fallback):
    url, _ = fallback
    r = ollama.Client(host=url).chat(model="llama3.2", messages=[{"role": "user", "content": "hello"}])
    assert r.done is True and r.message.role == "assistant" and r.message.content
    assert r.eval_count and r.eval_count > 0
    assert r.model == "gpt-4o-mini", "the answer names the provider's model that answered"


def test_ollama_chat_stream_falls_back(fallback):
    url, _ = fallback
    parts = list(ollama.Client(host=url).chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert len(parts) >= 2
    assert parts[-1].done is True and all(p.done is False for p in parts[:-1])
    assert parts[-1].eval_count == len(parts) - 1


def test_ollama_generate_falls_back(fallback):
    url, _ = fallback
    r = ollama.Client(host=url).generate(model="llama3.2", prompt="x", options={"num_predict": 4})
    assert r.response and r.done_reason == "length" and r.eval_count == 4


def test_openai_chat_falls_back(fallback):
    url, _ = fallback
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    r = c.chat.completions.create(model="llama3.2", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content
    chunks = list(c.chat.completions.create(model="llama3.2", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_the_answer_says_a_cloud_answered(fallback):
    url, _ = fallback
    req = urllib.request.Request(f"{url}/api/chat", data=json.dumps({"model": "llama3.2", "stream": False, "messages": [{"role": "user", "content": "x"}]}).encode())
    with urllib.request.urlopen(req) as r:
        assert r.headers["X-Corral-Fallback"] == "cloudsim"


def test_a_never_category_is_refused_and_the_cloud_sees_nothing(fallback):
    url, cloud_url = fallback
    with urllib.request.urlopen(f"{cloud_url}/_sim/received") as r:
        before = len(json.load(r))
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url, headers={"X-Corral-Category": "hr"}).chat(model="llama3.2", messages=[{"role": "user", "content": "payroll"}])
    assert e.value.status_code == 503
    assert "does not allow cloud fallback" in str(e.value)
    with urllib.request.urlopen(f"{cloud_url}/_sim/received") as r:
        assert len(json.load(r)) == before
