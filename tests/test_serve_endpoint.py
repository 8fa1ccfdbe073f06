"""The serve mode's OpenAI-compatible endpoint (agents.modes.serve.endpoint) over a fake engine: the official `openai`
client on loopback (fidelity: real sockets, real time, no timing assertions), and its pure parts exactly."""

from __future__ import annotations

import json
import socket
from contextlib import asynccontextmanager
from functools import partial
from typing import Final

import httpx2
import openai
import pytest
import trio

from agents.modes.serve.endpoint import Detokenizer, RequestError, parse_job, serve_http
from testbed.core.errors import ConfigError
from tests.fake_engine import FAKE_MODEL, FakeEngine

DEADLINE_S: Final = 20  # every I/O test ends by then, whatever happens
API_KEY: Final = "sk-geo-ring-test"


@asynccontextmanager
async def serving(engine: FakeEngine, **kwargs):
    """The engine and the endpoint on 127.0.0.1 (any port) in one nursery; its base URL. Leaving cancels both and
    checks that no request is still running in the engine and that the port is closed."""
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            host, port = await nursery.start(partial(serve_http, engine, **kwargs))
            assert host == "127.0.0.1" and port != 0
            try:
                yield f"http://{host}:{port}"
            finally:
                nursery.cancel_scope.cancel()
    assert not engine.running
    with pytest.raises(OSError):
        await trio.open_tcp_stream(host, port)


def client(url: str, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=DEADLINE_S)


async def stream_text(api: openai.AsyncOpenAI, max_tokens: int, **kwargs) -> tuple[str, list]:
    """A streamed completion's text and its chunks."""
    stream = await api.completions.create(model=FAKE_MODEL, prompt="hello", max_tokens=max_tokens, stream=True,
                                          **kwargs)
    async with stream:
        chunks = [chunk async for chunk in stream]
    return "".join(choice.text for chunk in chunks for choice in chunk.choices), chunks


@pytest.mark.fidelity
async def test_models_and_completions_streamed_and_not():
    engine = FakeEngine()
    async with serving(engine) as url, client(url) as api:
        models = await api.models.list()
        assert [model.id for model in models.data] == [FAKE_MODEL]

        whole = await api.completions.create(model=FAKE_MODEL, prompt=["hello"], max_tokens=20)
        assert whole.choices[0].text == FakeEngine.text(20)  # ends inside a two-byte character: U+FFFD
        assert whole.choices[0].finish_reason == "length"
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (5, 20, 25)

        text, chunks = await stream_text(api, 40, stream_options={"include_usage": True})
        assert text == FakeEngine.text(40)
        assert "\ufffd" not in text  # every multi-byte character arrived whole
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
        assert chunks[-1].usage.total_tokens == 45
        assert [chunk.choices[0].finish_reason for chunk in chunks[:-1]][-1] == "length"
        assert all(chunk.usage is None for chunk in chunks[:-1])
        assert chunks[0].id == f"cmpl-{len(engine.records) - 1}"  # the engine's record index

        text, chunks = await stream_text(api, 8)
        assert text == FakeEngine.text(8) and chunks[-1].usage is None
    assert all(record.completed for record in engine.records.values())


@pytest.mark.fidelity
async def test_chat_completion_streamed_and_not():
    engine = FakeEngine()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text",
                                                                                          "text": "hi"}]}]
    async with serving(engine) as url, client(url) as api:
        stream = await api.chat.completions.create(model=FAKE_MODEL, messages=messages, max_tokens=30, stream=True,
                                                   stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text == FakeEngine.text(30)
        assert chunks[-2].choices[0].finish_reason == "length"
        prompt_tokens = len("system: Be brief.\nuser: hi\nassistant: ".encode())
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (prompt_tokens, 30)

        whole = await api.chat.completions.create(model=FAKE_MODEL, messages=messages, max_completion_tokens=12)
        assert whole.choices[0].message.content == FakeEngine.text(12)
        assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 12


@pytest.mark.fidelity
async def test_bad_requests_get_openai_errors_and_the_stream_in_flight_completes():
    engine = FakeEngine(hold_after=3)  # the good stream waits after 3 tokens until the bad requests are answered
    async with serving(engine) as url, client(url) as api, httpx2.AsyncClient(base_url=url) as raw:
        stream = await api.completions.create(model=FAKE_MODEL, prompt="hello", max_tokens=24, stream=True)
        first = await stream.__anext__()
        assert first.choices[0].text == "T"

        answers = [await raw.post("/v1/completions", content=b'{"model": "geo-ring-fake", "prompt": '),
                   await raw.post("/v1/completions", json={"model": "nope", "prompt": "hi"}),
                   await raw.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": "hi", "max_tokens": 255}),
                   await raw.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": "hi", "max_tokens": 0}),
                   await raw.post("/v1/completions", json={"model": FAKE_MODEL, "max_tokens": 4}),
                   await raw.post("/v1/chat/completions", json={"model": FAKE_MODEL, "messages": [{"role": "user"}]})]
        assert [answer.status_code for answer in answers] == [400, 400, 400, 400, 400, 400]
        for answer in answers:
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert answers[1].json()["error"]["code"] == "model_not_found"
        assert "maximum context length is 256" in answers[2].json()["error"]["message"]
        assert answers[4].json()["error"]["param"] == "prompt"
        with pytest.raises(openai.BadRequestError):
            await api.completions.create(model=FAKE_MODEL, prompt="hi", max_tokens=1000)
        with pytest.raises(openai.BadRequestError):
            await api.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        assert engine.submitted == 1  # no bad request reached the engine

        engine.release.set()
        rest = [chunk async for chunk in stream]
        assert first.choices[0].text + "".join(c.choices[0].text for c in rest) == FakeEngine.text(24)
    assert engine.records[0].completed


@pytest.mark.fidelity
async def test_api_key_is_required_when_set():
    async with serving(FakeEngine(), api_key=API_KEY) as url:
        for key in ("unused", API_KEY + "x"):
            async with client(url, key) as api:
                with pytest.raises(openai.AuthenticationError):
                    await api.completions.create(model=FAKE_MODEL, prompt="hi", max_tokens=2)
                with pytest.raises(openai.AuthenticationError):
                    await api.models.list()
        async with httpx2.AsyncClient(base_url=url) as raw:
            answer = await raw.get("/v1/models")
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
        async with client(url, API_KEY) as api:
            text, _ = await stream_text(api, 6)
            assert text == FakeEngine.text(6)


async def wait_for_record(engine: FakeEngine, index: int):
    while index not in engine.records:
        await trio.sleep(0.01)
    return engine.records[index]


@pytest.mark.fidelity
async def test_a_client_that_goes_away_has_its_request_aborted_and_others_unaffected():
    engine = FakeEngine(hold_after=4)  # no request can end before the test lets it: only an abort ends one
    async with serving(engine) as url, client(url) as api, client(url) as other:
        kept = await other.completions.create(model=FAKE_MODEL, prompt="a", max_tokens=32, stream=True)
        kept_first = await kept.__anext__()

        gone = await api.completions.create(model=FAKE_MODEL, prompt="b", max_tokens=32, stream=True)
        await gone.__anext__()
        await gone.close()  # the connection closes mid-stream
        record = await wait_for_record(engine, 1)
        assert record.aborted and record.output_tokens < 32

        async with httpx2.AsyncClient(base_url=url) as raw:  # a non-streamed request whose client gives up
            with trio.move_on_after(0.2) as gave_up:
                await raw.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": "c", "max_tokens": 32})
            assert gave_up.cancelled_caught
        record = await wait_for_record(engine, 2)
        assert record.aborted and record.output_tokens < 32

        engine.release.set()
        rest = [chunk async for chunk in kept]
        assert kept_first.choices[0].text + "".join(c.choices[0].text for c in rest) == FakeEngine.text(32)
    assert engine.records[0].completed and not engine.records[0].aborted


@pytest.mark.fidelity
async def test_sixteen_concurrent_streams_all_complete():
    engine, texts, errors = FakeEngine(), {}, []

    async def one(api: openai.AsyncOpenAI, i: int) -> None:
        try:
            texts[i], _ = await stream_text(api, 24 + i, stream_options={"include_usage": True})
        except openai.OpenAIError as exc:
            errors.append(exc)

    async with serving(engine) as url, client(url) as api:
        await api.models.list()  # the client's one-time platform probe (a worker thread) before, not 16 at once
        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(one, api, i)
    assert errors == []
    assert texts == {i: FakeEngine.text(24 + i) for i in range(16)}
    assert len(engine.records) == 16 and all(record.completed for record in engine.records.values())


@pytest.mark.fidelity
async def test_a_port_in_use_is_a_config_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        in_use = pytest.RaisesGroup(pytest.RaisesExc(ConfigError, match="--port: .*127.0.0.1.*in use"))
        with trio.fail_after(DEADLINE_S), in_use:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(serve_http, FakeEngine(), port=taken.getsockname()[1]))


def test_detokenizer_sends_whole_characters_only():
    text = "héllo ✓ wörld"
    detokenizer = Detokenizer(FakeEngine.decode)
    deltas = [detokenizer.push(token) for token in text.encode()]
    assert "".join(deltas) == text and not any("\ufffd" in delta for delta in deltas)
    assert deltas[1:3] == ["", "é"]  # the first byte of é waits for the second
    assert detokenizer.finish() == ""

    cut = Detokenizer(FakeEngine.decode)
    assert [cut.push(token) for token in "✓".encode()[:2]] == ["", ""]
    assert cut.finish() == "\ufffd"  # a request that ends inside a character ends with what decode shows


def body(**fields) -> bytes:
    return json.dumps({"model": FAKE_MODEL, **fields}).encode()


def test_parse_job_reads_the_options_and_names_the_bad_field():
    engine = FakeEngine(max_context=64)
    job = parse_job(body(prompt="hi", stream=True, stream_options={"include_usage": True}, ignore_eos=True,
                         temperature=0.7), engine, chat=False)
    assert (job.prompt_ids, job.max_tokens, job.stream, job.include_usage) == ([104, 105], 16, True, True)
    chat = parse_job(body(messages=[{"role": "user", "content": "hi"}]), engine, chat=True)
    assert engine.decode(chat.prompt_ids) == "user: hi\nassistant: "
    assert chat.max_tokens == 64 - len(chat.prompt_ids)  # a chat's default: what the context leaves
    assert parse_job(body(prompt="hi", max_tokens=62), engine, chat=False).max_tokens == 62

    bad = {b"{": (400, None), body(prompt="hi", model="other"): (400, "model"),
           body(prompt="hi", max_tokens=63): (400, "max_tokens"), body(prompt="hi", max_tokens=0): (400, "max_tokens"),
           body(prompt="hi", max_tokens=True): (400, "max_tokens"), body(prompt=["a", "b"]): (400, "prompt"),
           body(prompt=""): (400, "prompt"), body(prompt="hi", n=2): (400, "n"),
           body(prompt="hi", stream="yes"): (400, "stream"), json.dumps({"prompt": "hi"}).encode(): (400, "model")}
    for raw, (status, param) in bad.items():
        with pytest.raises(RequestError) as caught:
            parse_job(raw, engine, chat=False)
        assert (caught.value.status, caught.value.param) == (status, param), raw
