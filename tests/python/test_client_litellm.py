"""litellm as a client of Corral: `ollama/` (generate) and `ollama_chat/` (chat) models,
streaming, embeddings, with `api_base` set to Corral. conftest keeps litellm off the Internet
(LITELLM_LOCAL_MODEL_COST_MAP, and a loopback-only socket guard)."""
import litellm

MSGS = [{"role": "user", "content": "hello"}]


def test_ollama_completion(corral):
    r = litellm.completion(model="ollama/llama3.2", messages=MSGS, api_base=corral, max_tokens=5)
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 5


def test_ollama_chat_completion(corral):
    r = litellm.completion(model="ollama_chat/llama3.2", messages=MSGS, api_base=corral, max_tokens=5)
    assert r.choices[0].message.content and r.usage.completion_tokens == 5


def test_streaming(corral):
    for model in ("ollama/llama3.2", "ollama_chat/llama3.2"):
        chunks = list(litellm.completion(model=model, messages=MSGS, api_base=corral, max_tokens=6, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text, f"{model} streamed text"


def test_embeddings(corral):
    r = litellm.embedding(model="ollama/nomic-embed-text", input=["one", "two"], api_base=corral)
    assert len(r.data) == 2 and len(r.data[0]["embedding"]) > 0


def test_chat_on_llamacpp(llamacpp):
    r = litellm.completion(model="ollama_chat/tiny", messages=MSGS, api_base=llamacpp, max_tokens=6)
    assert r.choices[0].message.content and r.usage.completion_tokens == 6


def test_chat_during_cloud_fallback(fallback):
    url, _ = fallback
    r = litellm.completion(model="ollama_chat/llama3.2", messages=MSGS, api_base=url, max_tokens=4)
    assert r.choices[0].message.content
