"""The serve mode's OpenAI-compatible HTTP endpoint: a Starlette app over the ring's entry (an Engine), served by
hypercorn's Trio worker inside the entry's own nursery (DESIGN section 8: one event loop, no thread).

What it implements of OpenAI's API (enough for the `openai` client, guidellm and `vllm bench serve`):
- `GET /v1/models`: one model, the engine's.
- `POST /v1/completions`: `prompt` (a string or a list of one), `max_tokens` (default 16), `stream`,
  `stream_options.include_usage`. `ignore_eos`, `temperature` and `top_p` are accepted and change nothing: every
  request runs to `max_tokens` (EOS is always ignored) and the ring samples as its scenario says, not as asked.
- `POST /v1/chat/completions`: `messages` (text content) become one prompt by CHAT_TEMPLATE; `max_completion_tokens`
  or `max_tokens` (default: what the context leaves, as vLLM); streamed chunks are `chat.completion.chunk`s.
- Streams are server-sent events (Starlette's StreamingResponse), one per token that completes a character, ending
  with `data: [DONE]`; with `include_usage` the event before it has `usage` and no choices. `finish_reason` is
  "length" ("abort" when the ring dropped the request before its end, as vLLM says).
- Errors are OpenAI's error object `{"error": {"message", "type", "param", "code"}}`: 400 for bad JSON, a missing or
  invalid field, another model (code "model_not_found"; OpenAI and vLLM answer that with 404, issue 54 asks 400 for
  every bad request), `max_tokens` < 1, prompt + `max_tokens` beyond engine.max_context; 401 without
  `Authorization: Bearer <api_key>` when one is set (vLLM's `--api-key`). A refused request never reaches the engine.
Not implemented: `n` > 1, `best_of`, `logprobs`, `echo`, `suffix`, `stop`, token-id prompts, tools, images.

Each HTTP request is one engine.submit; its id is "cmpl-<index>" ("chatcmpl-<index>"), its RequestRecord's index, so
a client's measurements can be set beside the testbed's records; `usage` reads that record. A request whose client
goes away (the server reports http.disconnect) is aborted at once.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from functools import partial
from typing import AsyncIterator, Callable, Final

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agents.modes.serve.requests import Engine, Submitted
from testbed.core.errors import ConfigError, TestbedError, leaf_errors

DEFAULT_MAX_TOKENS: Final = 16  # OpenAI's default for /v1/completions
CHAT_TEMPLATE: Final = "{role}: {content}\n"  # a line a message, then ASSISTANT_CUE (the ring's models know no chat)
ASSISTANT_CUE: Final = "assistant: "
CLIENT_GONE_STATUS: Final = 499  # what is "sent" to a client that went away (nginx's name for it; nobody reads it)
REPLACEMENT: Final = "\ufffd"  # what a byte-level decode shows for a character whose bytes are not all there yet


class RequestError(TestbedError):
    """A request the endpoint refuses; answered as OpenAI's error object with its HTTP status."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def response(self) -> JSONResponse:
        error = {"message": str(self), "type": "invalid_request_error", "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True)
class Job:
    """One request, checked: what to submit and how to answer."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def _field(body: dict, name: str, kind: type | tuple[type, ...], default=None):
    value = body.get(name, default)
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
        raise RequestError(f"'{name}' must be {getattr(kind, '__name__', kind)}, got {value!r}", param=name)
    return value


def _prompt_text(body: dict, chat: bool) -> str:
    """The completion's prompt, or the chat's messages through CHAT_TEMPLATE followed by ASSISTANT_CUE."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise RequestError("'prompt' must be a string (or a list of one string)", param="prompt")
        return prompt
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    lines = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # text parts: [{"type": "text", "text": ...}, ...]
            texts = [part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
                     for part in content]
            content = "".join(texts) if all(isinstance(text, str) for text in texts) else None
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(content, str):
            raise RequestError(f"messages[{i}] must have a string 'role' and text 'content'", param="messages")
        lines.append(CHAT_TEMPLATE.format(role=message["role"], content=content))
    return "".join(lines) + ASSISTANT_CUE


def parse_job(raw: bytes, engine: Engine, *, chat: bool) -> Job:
    """Check a request body against the engine (model, context); RequestError names the field and what was wrong."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    model = _field(body, "model", str)
    if model is None:
        raise RequestError("'model' is required", param="model")
    if model != engine.model_name:
        raise RequestError(f"The model `{model}` does not exist.", param="model", code="model_not_found")
    if _field(body, "n", int) not in (None, 1):
        raise RequestError("only n = 1 is served", param="n")
    stream = bool(_field(body, "stream", bool))
    include_usage = bool(_field(_field(body, "stream_options", dict) or {}, "include_usage", bool))
    for name, kind in (("ignore_eos", bool), ("temperature", (int, float)), ("top_p", (int, float))):
        _field(body, name, kind)  # accepted, and they change nothing (the module's docstring says why)
    prompt_ids, where = engine.encode(_prompt_text(body, chat)), "messages" if chat else "prompt"
    if not prompt_ids:
        raise RequestError(f"the {where} is empty", param=where)
    max_tokens = _field(body, "max_completion_tokens", int) if chat else None
    max_tokens = _field(body, "max_tokens", int) if max_tokens is None else max_tokens
    if max_tokens is None:  # OpenAI's default for a completion; for a chat, what the context leaves (vLLM)
        max_tokens = engine.max_context - len(prompt_ids) if chat else DEFAULT_MAX_TOKENS
    if len(prompt_ids) + max(max_tokens, 1) > engine.max_context:
        raise RequestError(f"This model's maximum context length is {engine.max_context} tokens. However, you "
                           f"requested {len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the {where}, "
                           f"{max_tokens} in the completion).", param="max_tokens")
    if max_tokens < 1:
        raise RequestError(f"'max_tokens' must be at least 1, got {max_tokens}", param="max_tokens")
    return Job(chat, prompt_ids, max_tokens, stream, include_usage)


class Detokenizer:
    """The text of the tokens so far, handed out as new suffixes. It decodes all the ids each time and holds back
    trailing U+FFFD: with a byte-level vocabulary a character's bytes may come in several tokens, and a suffix is
    only sent once its characters are whole (finish() sends the rest as decoded, invalid bytes included)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode, self.ids, self.text = decode, [], ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        stable = self.decode(self.ids).rstrip(REPLACEMENT)
        delta = stable[len(self.text):] if stable.startswith(self.text) else ""
        self.text += delta
        return delta

    def finish(self) -> str:
        full = self.decode(self.ids)
        delta, self.text = full[len(self.text):], full
        return delta


class Answer:
    """OpenAI's response objects for one request: its id, its choices, its usage (from the engine's record)."""

    def __init__(self, job: Job, submitted: Submitted, model: str):
        self.job, self.submitted, self.model = job, submitted, model
        self.id = f"{'chatcmpl' if job.chat else 'cmpl'}-{submitted.index}"
        self.created = int(time.time())
        self.ended = False  # the engine closed the token channel: nothing to abort

    def finish_reason(self, generated: int) -> str:
        return "length" if generated >= self.job.max_tokens else "abort"

    def usage(self, generated: int) -> dict:
        record = self.submitted.record()  # None only if the engine closed the tokens before recording: count here
        prompt = record.prompt_tokens if record else len(self.job.prompt_ids)
        output = record.output_tokens if record else generated
        return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}

    def chunk(self, choices: list[dict], **extra) -> dict:
        kind = ("chat.completion.chunk" if self.job.stream else "chat.completion") if self.job.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def choice(self, text: str, finish_reason: str | None = None, *, first: bool = False) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if not self.job.chat:
            return {**choice, "text": text}
        if not self.job.stream:
            return {**choice, "message": {"role": "assistant", "content": text}}
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {**choice, "delta": delta}


def _event(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(answer: Answer, detokenizer: Detokenizer) -> AsyncIterator[str]:
    """The request's server-sent events, one per token that completes text, then the finish, usage and [DONE]."""
    usage_none = {"usage": None} if answer.job.include_usage else {}
    if answer.job.chat:
        yield _event(answer.chunk([answer.choice("", first=True)], **usage_none))
    async for token in answer.submitted.tokens:
        if delta := detokenizer.push(token):
            yield _event(answer.chunk([answer.choice(delta)], **usage_none))
    answer.ended = True
    generated = len(detokenizer.ids)
    yield _event(answer.chunk([answer.choice(detokenizer.finish(), answer.finish_reason(generated))], **usage_none))
    if answer.job.include_usage:
        yield _event(answer.chunk([], usage=answer.usage(generated)))
    yield _event("[DONE]")


class EventStream(StreamingResponse):
    """A request's server-sent events (Starlette's streaming response: it stops the stream when the server reports
    http.disconnect). Every way out but the engine's end of the tokens aborts the request, in this finally."""

    media_type = "text/event-stream"

    def __init__(self, answer: Answer, detokenizer: Detokenizer):
        super().__init__(_events(answer, detokenizer), headers={"Cache-Control": "no-cache"})
        self.answer = answer

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.answer.ended:
                self.answer.submitted.abort()
            with trio.CancelScope(shield=True):
                await self.body_iterator.aclose()


async def _cancel_on_disconnect(request: Request, scope: trio.CancelScope) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _whole(request: Request, answer: Answer, detokenizer: Detokenizer) -> Response:
    """A non-streamed answer: every token, gathered while watching for the client going away."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_on_disconnect, request, nursery.cancel_scope)
        async for token in answer.submitted.tokens:
            detokenizer.push(token)
        answer.ended = True
        nursery.cancel_scope.cancel()
    if not answer.ended:
        return Response(status_code=CLIENT_GONE_STATUS)
    generated = len(detokenizer.ids)
    detokenizer.finish()
    choice = answer.choice(detokenizer.text, answer.finish_reason(generated))
    return JSONResponse(answer.chunk([choice], usage=answer.usage(generated)))


def _refused(request: Request, api_key: str | None) -> Response | None:
    """The 401 answer to a request without `Authorization: Bearer <api_key>` when api_key is set; None: it may pass."""
    given = request.headers.get("authorization", "").encode()
    if api_key is None or secrets.compare_digest(given, f"Bearer {api_key}".encode()):
        return None
    return RequestError("Incorrect API key provided.", status=401, code="invalid_api_key").response()


async def _generate(engine: Engine, api_key: str | None, chat: bool, request: Request) -> Response:
    if refused := _refused(request, api_key):
        return refused
    try:
        job = parse_job(await request.body(), engine, chat=chat)
    except RequestError as exc:
        return exc.response()
    except ClientDisconnect:
        return Response(status_code=CLIENT_GONE_STATUS)
    answer = Answer(job, await engine.submit(job.prompt_ids, job.max_tokens), engine.model_name)
    detokenizer = Detokenizer(engine.decode)
    if job.stream:
        return EventStream(answer, detokenizer)  # it aborts the request itself, in its own finally
    try:
        return await _whole(request, answer, detokenizer)
    finally:
        if not answer.ended:
            answer.submitted.abort()


async def _models(engine: Engine, api_key: str | None, request: Request) -> Response:
    model = {"id": engine.model_name, "object": "model", "created": 0, "owned_by": "geo-ring"}
    return _refused(request, api_key) or JSONResponse({"object": "list", "data": [model]})


async def _health(request: Request) -> Response:
    return Response(status_code=200)  # vLLM's GET /health (load generators ask it before they start)


def build_app(engine: Engine, *, api_key: str | None = None) -> Starlette:
    """The endpoint as an ASGI app over an engine; api_key set: every /v1 route wants `Authorization: Bearer <key>`."""
    return Starlette(routes=[
        Route("/health", _health, methods=["GET"]),
        Route("/v1/models", partial(_models, engine, api_key), methods=["GET"]),
        Route("/v1/completions", partial(_generate, engine, api_key, False), methods=["POST"]),
        Route("/v1/chat/completions", partial(_generate, engine, api_key, True), methods=["POST"]),
    ])


async def serve_http(engine: Engine, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                     shutdown: trio.Event | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the endpoint with hypercorn's Trio worker until `shutdown` is set (then the listener closes and the
    responses under way get hypercorn's graceful_timeout to finish: their last tokens, usage and [DONE]) or until
    cancelled (every connection closes; the requests in flight are aborted by their responses' finally). Reports the
    bound (host, port) once listening (port 0: any free port, the real one reported)."""
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.errorlog = logging.getLogger("hypercorn.error")  # the program's logging decides, not hypercorn's stderr
    config.accesslog = None
    binds = None
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, build_app(engine, api_key=api_key), config, mode="asgi",
                                                shutdown_trigger=None if shutdown is None else shutdown.wait))
            bound_host, _, bound_port = binds[0].removeprefix("http://").rpartition(":")  # hypercorn: "http://h:p"
            task_status.started((bound_host.strip("[]"), int(bound_port)))
    except BaseException as exc:  # hypercorn's nurseries wrap a failed bind's OSError in exception groups
        causes = leaf_errors(exc)
        if binds is not None or not all(isinstance(cause, OSError) for cause in causes):
            raise
        raise ConfigError(f"cannot serve HTTP on {host}:{port}: {causes[0].strerror}", key="--port") from exc
