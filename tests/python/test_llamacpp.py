"""A real llama.cpp server (OpenAI-compatible, no /api/*) as Corral's only node: the official
Ollama client gets Ollama answers with real tokens."""
import ollama


def test_ollama_lists_the_llamacpp_model(llamacpp):
    assert "tiny" in {m.model for m in ollama.Client(host=llamacpp).list().models}


def test_ollama_chat_on_llamacpp(llamacpp):
    r = ollama.Client(host=llamacpp).chat(model="tiny", messages=[{"role": "user", "content": "hello"}], options={"num_predict": 8, "temperature": 0})
    assert r.done is True and r.message.role == "assistant" and r.message.content
    assert r.eval_count == 8 and r.done_reason == "length"
    assert r.prompt_eval_count and r.prompt_eval_count > 0


def test_ollama_chat_stream_on_llamacpp(llamacpp):
    parts = list(ollama.Client(host=llamacpp).chat(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, options={"num_predict": 12}))
    assert len(parts) >= 3
    assert parts[-1].done is True and parts[-1].eval_count == 12
    assert all(p.done is False for p in parts[:-1])
    assert "".join(p.message.content for p in parts)


def test_ollama_generate_on_llamacpp_is_deterministic_with_a_seed(llamacpp):
    c = ollama.Client(host=llamacpp)
    a = c.generate(model="tiny", prompt="x", options={"num_predict": 6, "seed": 3, "temperature": 0})
    b = c.generate(model="tiny", prompt="x", options={"num_predict": 6, "seed": 3, "temperature": 0})
    assert a.response == b.response and a.eval_count == 6
