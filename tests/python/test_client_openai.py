"""The openai SDK against Corral's `/v1`: chat, streaming with usage, embeddings,
`models.retrieve`, tools and `response_format`, over sims, a llama.cpp node and cloud fallback.
(test_compat.py has the plain chat / stream / list.)"""
import json

import openai

from conftest import sim_received

MSGS = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused")


def test_stream_with_usage(corral):
    chunks = list(client(corral).chat.completions.create(model="llama3.2", messages=MSGS, max_tokens=6, stream=True,
                                                        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6, "the last chunk carries usage only"
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_embeddings(corral):
    r = client(corral).embeddings.create(model="nomic-embed-text", input=["a", "b"])
    assert len(r.data) == 2 and r.data[1].index == 1 and len(r.data[0].embedding) > 0


def test_models_retrieve(corral):
    m = client(corral).models.retrieve("llama3.2")
    assert m.id.startswith("llama3.2") and m.object == "model"


def test_models_retrieve_leaves_the_model_available(corral):
    c = client(corral)
    c.models.retrieve("llama3.2")
    for _ in range(10):
        assert c.chat.completions.create(model="llama3.2", messages=MSGS, max_tokens=1).choices[0].message.content


def test_tools_get_a_tool_call_back(corral):
    # The sim answers a request with tools by calling the first tool (OpenAI's shape on /v1).
    r = client(corral).chat.completions.create(model="llama3.2", messages=MSGS, tools=TOOLS, max_tokens=4)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == TOOLS[0]["function"]["name"]
    assert isinstance(json.loads(call.function.arguments), dict)


def test_response_format(corral):
    c = client(corral)
    r = c.chat.completions.create(model="llama3.2", messages=MSGS, max_tokens=4, response_format={"type": "json_object"})
    assert r.choices[0].message.content is not None
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}
    r = c.chat.completions.create(model="llama3.2", messages=MSGS, max_tokens=4, response_format=schema)
    assert r.choices[0].message.content is not None
    assert r.choices[0].finish_reason == "length", "four tokens cut the JSON short, as on Ollama"
    r = c.chat.completions.create(model="llama3.2", messages=MSGS, response_format=schema)
    assert isinstance(json.loads(r.choices[0].message.content)["a"], str), r.choices[0].message.content


def test_parse_into_a_pydantic_model(corral):
    from pydantic import BaseModel

    class Pet(BaseModel):
        name: str
        age: int

    r = client(corral).chat.completions.parse(model="llama3.2", messages=MSGS, response_format=Pet)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.name and pet.age == 1, r


def test_chat_and_stream_usage_on_llamacpp(llamacpp):
    c = client(llamacpp)
    r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6)
    assert r.choices[0].message.content and r.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens == 6


def test_tools_and_response_format_reach_the_cloud_in_fallback(fallback):
    url, cloud = fallback
    c = client(url)
    r = c.chat.completions.create(model="llama3.2", messages=MSGS, tools=TOOLS, max_tokens=4)
    assert r.choices[0].message.tool_calls, "the provider's tool call comes back"
    r = c.chat.completions.create(model="llama3.2", messages=MSGS, max_tokens=4, response_format={"type": "json_object"})
    assert r.choices[0].message.content is not None
    sent = [json.loads(x["body"]) for x in sim_received([cloud]) if x["path"] == "/v1/chat/completions"]
    assert sent[-2]["tools"] == TOOLS, "tools reach the provider as sent"
    assert sent[-1]["response_format"] == {"type": "json_object"}, "response_format reaches the provider"
