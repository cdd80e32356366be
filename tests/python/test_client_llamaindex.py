"""llama-index's Ollama LLM (llama-index-llms-ollama) and OllamaEmbedding
(llama-index-embeddings-ollama) pointed at Corral. The LLM calls /api/show first (for the context
window), so show must answer on every node kind."""
from llama_index.core.llms import ChatMessage
from llama_index.embeddings.ollama import OllamaEmbedding
from llama_index.llms.ollama import Ollama

import pytest

MSGS = [ChatMessage(role="user", content="hello")]


def llm(url, model="llama3.2"):
    return Ollama(model=model, base_url=url, request_timeout=30, additional_kwargs={"num_predict": 5})


def test_complete(corral):
    r = llm(corral).complete("hello")
    assert r.text and r.raw["eval_count"] == 5


def test_chat(corral):
    r = llm(corral).chat(MSGS)
    assert r.message.role == "assistant" and r.message.content


def test_stream_chat(corral):
    parts = list(llm(corral).stream_chat(MSGS))
    assert len(parts) >= 2
    assert parts[-1].message.content == "".join(p.delta for p in parts), "deltas add up to the message"


def test_chat_with_a_given_context_window_during_cloud_fallback(fallback):
    # With context_window set, llama-index does not call show: the chat itself falls back.
    url, _ = fallback
    r = Ollama(model="llama3.2", base_url=url, request_timeout=30, context_window=4096, additional_kwargs={"num_predict": 4}).chat(MSGS)
    assert r.message.content


def test_context_window_comes_from_show(corral):
    assert llm(corral).metadata.context_window > 0


def test_embedding(corral):
    e = OllamaEmbedding(model_name="nomic-embed-text", base_url=corral)
    v = e.get_text_embedding("one")
    assert len(v) > 0
    assert len(e.get_text_embedding_batch(["a", "b", "c"])) == 3


def test_complete_on_llamacpp(llamacpp):
    r = llm(llamacpp, "tiny").complete("hello")
    assert r.text


def test_chat_during_cloud_fallback(fallback):
    url, _ = fallback
    r = llm(url).chat(MSGS)
    assert r.message.content
