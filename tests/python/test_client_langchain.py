"""langchain-ollama (ChatOllama, OllamaEmbeddings) pointed at Corral: over sims (`corral serve`
and `corral demo`), with a real llama.cpp node (kind = "openai"), and during cloud fallback."""
import asyncio
import json

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.tools import tool
from langchain_ollama import ChatOllama, OllamaEmbeddings

from conftest import sim_received


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def test_invoke(corral):
    m = ChatOllama(model="llama3.2", base_url=corral, num_predict=5)
    r = m.invoke("hello")
    assert isinstance(r, AIMessage) and r.content
    assert r.usage_metadata["output_tokens"] == 5
    assert r.response_metadata["done_reason"] == "length"


def test_stream(corral):
    chunks = list(ChatOllama(model="llama3.2", base_url=corral, num_predict=6).stream("hi"))
    assert len(chunks) >= 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(c.content for c in chunks)


def test_astream(corral):
    async def run():
        return [c async for c in ChatOllama(model="llama3.2", base_url=corral, num_predict=6).astream("hi")]

    chunks = asyncio.run(run())
    assert len(chunks) >= 2 and "".join(c.content for c in chunks)


def test_bind_tools_gets_a_tool_call_back(corral):
    # The sim answers a request with tools by calling the first tool (Ollama's shape).
    r = ChatOllama(model="llama3.2", base_url=corral, num_predict=4).bind_tools([get_weather]).invoke("weather in Oslo?")
    assert isinstance(r, AIMessage) and r.tool_calls, r
    assert r.tool_calls[0]["name"] == "get_weather" and isinstance(r.tool_calls[0]["args"], dict)


def test_bind_tools_request_reaches_a_sim(sims, served):
    before = sum(1 for x in sim_received(sims) if x["path"] == "/api/chat")
    r = ChatOllama(model="llama3.2", base_url=served, num_predict=2).bind_tools([get_weather]).invoke("weather?")
    assert r.tool_calls and r.tool_calls[0]["name"] == "get_weather"
    after = sum(1 for x in sim_received(sims) if x["path"] == "/api/chat")
    assert after == before + 1, "one /api/chat with tools reached exactly one sim node"


def test_structured_output_parses_into_the_model(corral):
    # Ollama constrains the answer to the schema; the sim answers a value of it.
    from pydantic import BaseModel

    class Pet(BaseModel):
        name: str
        age: int
        tags: list[str]

    r = ChatOllama(model="llama3.2", base_url=corral).with_structured_output(Pet).invoke("describe a pet")
    assert isinstance(r, Pet) and r.name and r.age == 1 and len(r.tags) == 1, r


def test_embeddings(corral):
    e = OllamaEmbeddings(model="nomic-embed-text", base_url=corral)
    docs = e.embed_documents(["one", "two", "three"])
    assert len(docs) == 3 and len(docs[0]) > 0
    assert len(e.embed_query("one")) == len(docs[0])


def test_invoke_and_stream_on_llamacpp(llamacpp):
    m = ChatOllama(model="tiny", base_url=llamacpp, num_predict=6, temperature=0)
    r = m.invoke("hello")
    assert r.content and r.usage_metadata["output_tokens"] == 6
    assert "".join(c.content for c in m.stream("hi"))


def test_invoke_and_tools_during_cloud_fallback(fallback):
    url, cloud = fallback
    m = ChatOllama(model="llama3.2", base_url=url, num_predict=4)
    assert m.invoke("hello").content
    r = m.bind_tools([get_weather]).invoke("weather in Oslo?")
    assert isinstance(r, AIMessage) and r.tool_calls and r.tool_calls[0]["name"] == "get_weather", "the provider's tool call comes back in Ollama's shape"
    sent = [json.loads(x["body"]) for x in sim_received([cloud]) if x["path"] == "/v1/chat/completions"]
    assert sent[-1]["tools"][0]["function"]["name"] == "get_weather", "the tools reach the cloud provider translated"
