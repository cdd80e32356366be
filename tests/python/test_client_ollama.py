"""The official ollama Python client, every method, sync and async, against Corral (`corral serve`
over sims, and `corral demo`). Model operations use names of their own, so the other modules'
models stay as they are."""
import asyncio

import ollama
import pytest

MSG = [{"role": "user", "content": "hello"}]


def test_chat_and_generate(corral):
    c = ollama.Client(host=corral)
    r = c.chat(model="llama3.2", messages=MSG, options={"num_predict": 5})
    assert r.done and r.message.role == "assistant" and r.message.content
    assert r.eval_count == 5 and r.done_reason == "length"
    g = c.generate(model="llama3.2", prompt="x", options={"num_predict": 3})
    assert g.done and g.response and g.eval_count == 3


def test_generate_stream(corral):
    parts = list(ollama.Client(host=corral).generate(model="llama3.2", prompt="x", stream=True, options={"num_predict": 6}))
    assert parts[-1].done and parts[-1].eval_count == 6
    assert all(not p.done for p in parts[:-1]) and "".join(p.response for p in parts)


def test_embed_and_legacy_embeddings(corral):
    c = ollama.Client(host=corral)
    e = c.embed(model="nomic-embed-text", input="one")
    assert len(e.embeddings) == 1 and len(e.embeddings[0]) > 0
    legacy = c.embeddings(model="nomic-embed-text", prompt="one")
    assert len(legacy.embedding) == len(e.embeddings[0]), "/api/embeddings gives a vector of the model's size"


def test_list_show_ps(corral):
    c = ollama.Client(host=corral)
    assert "llama3.2:latest" in {m.model for m in c.list().models}
    s = c.show("llama3.2")
    assert s.details and s.details.family and s.modelinfo is not None
    c.generate(model="llama3.2", prompt="warm", options={"num_predict": 1})
    assert any(m.model == "llama3.2:latest" for m in c.ps().models)


def test_pull_with_progress_then_copy_create_delete(corral):
    c = ollama.Client(host=corral)
    progress = list(c.pull("corral-py-pulled", stream=True))
    assert progress[-1].status == "success", "the last progress line is the overall result"
    assert any(p.total and p.completed is not None for p in progress), "layer progress carries total / completed"
    assert "corral-py-pulled:latest" in {m.model for m in c.list().models}
    assert c.copy("corral-py-pulled", "corral-py-copy").status == "success"
    created = list(c.create(model="corral-py-created", from_="llama3.2", system="be brief", stream=True))
    assert created[-1].status == "success"
    names = {m.model for m in c.list().models}
    assert {"corral-py-copy:latest", "corral-py-created:latest"} <= names
    for m in ("corral-py-pulled", "corral-py-copy", "corral-py-created"):
        assert c.delete(m).status == "success"
    assert not {"corral-py-pulled:latest", "corral-py-copy:latest"} & {m.model for m in c.list().models}


def test_pull_without_stream(corral):
    r = ollama.Client(host=corral).pull("corral-py-quiet")
    assert r.status == "success"


def test_delete_of_a_missing_model_is_a_404(corral):
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=corral).delete("corral-py-never-there")
    assert e.value.status_code == 404


def test_delete_of_a_missing_model_is_worded_as_ollama_words_it(corral):
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=corral).delete("corral-py-never-there")
    assert "model 'corral-py-never-there' not found" in e.value.error


def test_async_client_every_method(corral):
    async def run():
        c = ollama.AsyncClient(host=corral)
        r = await c.chat(model="llama3.2", messages=MSG, options={"num_predict": 4})
        assert r.message.content and r.eval_count == 4
        parts = [p async for p in await c.chat(model="llama3.2", messages=MSG, stream=True, options={"num_predict": 4})]
        assert parts[-1].done and "".join(p.message.content for p in parts)
        g = await c.generate(model="llama3.2", prompt="x", options={"num_predict": 2})
        assert g.response and g.eval_count == 2
        assert len((await c.embed(model="nomic-embed-text", input=["a", "b"])).embeddings) == 2
        assert (await c.embeddings(model="nomic-embed-text", prompt="a")).embedding
        assert "llama3.2:latest" in {m.model for m in (await c.list()).models}
        assert (await c.show("llama3.2")).details.family
        assert (await c.ps()).models is not None
        progress = [p async for p in await c.pull("corral-py-async", stream=True)]
        assert progress[-1].status == "success"
        assert (await c.copy("corral-py-async", "corral-py-async2")).status == "success"
        assert (await c.create(model="corral-py-async3", from_="llama3.2")).status == "success"
        for m in ("corral-py-async", "corral-py-async2", "corral-py-async3"):
            assert (await c.delete(m)).status == "success"

    asyncio.run(run())


def test_chat_generate_embed_list_on_llamacpp(llamacpp):
    c = ollama.Client(host=llamacpp)
    assert c.chat(model="tiny", messages=MSG, options={"num_predict": 4}).eval_count == 4
    assert c.generate(model="tiny", prompt="x", options={"num_predict": 4}).response
    assert "tiny" in {m.model for m in c.list().models}


def test_show_on_llamacpp(llamacpp):
    assert ollama.Client(host=llamacpp).show("tiny").details is not None


def test_chat_generate_during_cloud_fallback(fallback):
    url, _ = fallback
    c = ollama.AsyncClient(host=url)

    async def run():
        r = await c.chat(model="llama3.2", messages=MSG, options={"num_predict": 3})
        assert r.message.content
        parts = [p async for p in await c.generate(model="llama3.2", prompt="x", stream=True, options={"num_predict": 3})]
        assert parts[-1].done and "".join(p.response for p in parts)

    asyncio.run(run())


def test_show_during_cloud_fallback(fallback):
    url, _ = fallback
    assert ollama.Client(host=url).show("llama3.2").details is not None
