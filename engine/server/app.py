"""The FastAPI application of `msa-eval serve`: routes, error handlers, engine thread lifecycle.

`build_app(llm, config)` wraps an already loaded `engine.LLM`; `create_app(config)` loads it.
One engine thread (see async_engine) serves every request; the routes only render prompts,
validate limits and turn engine outputs into OpenAI-shaped JSON or server-sent events.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match

from engine.server.async_engine import AsyncEngine, QueueFullError
from engine.server.bodylimit import BodyLimit, default_max_body_bytes
from engine.server.chat import chat_completions
from engine.server.completions import completions
from engine.server.config import ServerConfig
from engine.server.errors import ApiError
from engine.server.generation import ClientDisconnected
from engine.server.jsonguard import MAX_JSON_DEPTH, RequestError
from engine.server.metrics import ServerMetrics, kv_cache_usage
from engine.server.reasoning import reasoning_tags
from engine.server.responses import create_response, not_stored
from engine.server.responses_schemas import ResponsesRequest
from engine.server.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from engine.server.state import ServingState
from engine.server.tokenize import tokenizer_router


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, RequestError):
        return str(cause), cause.param
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if e.get("type") == "json_invalid":
        return f"request body is not valid JSON: {e.get('msg')}", None
    where = ".".join(loc) or "body"
    return f"invalid request: {where}: {e.get('msg')}", (loc[0] if loc else None)


_ROUTES = ("/v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /v1/models/{model}, /tokenize, "
           "/detokenize, /tokenizer_info, /health, /metrics")


def _http_error(request: Request, exc: HTTPException) -> ApiError:
    """Framework errors (unknown route, wrong method, unparseable body) in the OpenAI shape."""
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return ApiError(404, f"no route {request.method} {request.url.path}; this server serves {_ROUTES}",
                        code="unknown_url")
    if exc.status_code == 405:
        allowed = headers.get("Allow") or headers.get("allow") or "another method"
        return ApiError(405, f"method {request.method} is not allowed on {request.url.path}; use {allowed}",
                        code="method_not_allowed", headers=headers)
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        why = f"it is nested too deeply (at most {MAX_JSON_DEPTH} levels of arrays and objects are accepted)"
    elif isinstance(cause, UnicodeDecodeError):
        why = f"it is not UTF-8 ({cause.reason} at byte {cause.start})"
    elif cause is not None:
        why = f"{type(cause).__name__}: {cause}"
    else:
        why = str(exc.detail)
    if exc.status_code == 400:
        return ApiError(400, f"request body could not be parsed as JSON: {why}; send a UTF-8 JSON object")
    return ApiError(exc.status_code, f"{exc.detail}", headers=headers)


def _on_step(metrics: ServerMetrics):
    seen = {"forward_passes": 0, "prefill_tokens": 0}  # the engine's counts already added to /metrics

    def update(engine: Any) -> None:
        usage = kv_cache_usage(engine)
        if usage is not None:
            metrics.kv_cache_usage.set(usage)
        for name, last in seen.items():
            now = getattr(engine, name, last)
            getattr(metrics, name).inc(now - last)
            seen[name] = now
    return update


def route_label(routes: list[BaseRoute], scope: dict) -> str:
    """The route template a request matches (`/v1/models/{model:path}`), "other" for a path no route serves:
    a metric label set bounded by the routes, whatever URLs clients probe. Register /v1 routes on the app
    itself: FastAPI 0.165 keeps an `include_router` router as one entry without a path, labelled "other"."""
    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:  # PARTIAL: the path matches, the method does not (a 405)
            return getattr(route, "path", "other")
    return "other"


class _RequestMetrics:
    """Pure ASGI middleware counting /v1/* requests by route template and status and timing them.

    (Not `@app.middleware("http")`: BaseHTTPMiddleware wraps `receive`, which hides a client's
    disconnect from `Request.is_disconnected()`.)
    """

    def __init__(self, app: Any, metrics: ServerMetrics, routes: list[BaseRoute]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def send_and_record(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            label = route_label(self.routes, scope)
            self.metrics.requests.labels(label, str(status[0])).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - start)


def build_app(llm: Any, config: ServerConfig) -> FastAPI:
    metrics = ServerMetrics()
    bridge = AsyncEngine(llm.engine, capacity=config.max_batch + config.max_queue, on_step=_on_step(metrics),
                         on_abort=metrics.aborted.inc)
    state = ServingState.build(llm, bridge, metrics, config)
    state.reasoning = reasoning_tags(config.reasoning_parser, getattr(llm.tokenizer, "chat_template", None))
    _ = state.max_prompt_chars  # scans the vocabulary once, at startup

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        bridge.start()
        yield
        bridge.shutdown()

    app = FastAPI(title="msa-eval OpenAI-compatible server", lifespan=lifespan)
    app.state.serving = state

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes or default_max_body_bytes(state.max_model_len))
    app.add_middleware(_RequestMetrics, metrics=metrics, routes=app.router.routes)  # outermost: counts the 413s too

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return ApiError(400, message, param=param).response()

    @app.exception_handler(HTTPException)
    async def framework(request: Request, exc: HTTPException) -> Response:
        return _http_error(request, exc).response()

    @app.exception_handler(QueueFullError)
    async def full(_: Request, exc: QueueFullError) -> Response:
        return ApiError(429, f"{exc}; retry later or start the server with a larger --max-queue",
                        code="queue_full", headers={"Retry-After": "1"}).response()

    @app.exception_handler(ClientDisconnected)
    async def gone(_: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response and the server drops the connection: say so
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", headers={"Connection": "close"}).response()

    @app.get("/health")
    async def health() -> Response:
        if not bridge.alive:
            return ApiError(503, "the engine thread is not running; restart the server").response()
        return JSONResponse({"status": "ok", "model": state.model_names[0]})

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue_depth.set(len(bridge.waiting_first_token))
        metrics.running.set(bridge.admitted - len(bridge.waiting_first_token))
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    def card(name: str) -> ModelCard:
        return ModelCard(id=name, created=state.created, max_model_len=state.max_model_len,
                         kv_cache_dtype=getattr(state.llm, "kv_dtype_name", None))

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[card(n) for n in state.model_names])

    @app.get("/v1/models/{model:path}")  # :path: a served name may hold "/" (org/name)
    async def model(model: str) -> ModelCard:
        state.check_model(model)
        return card(model)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await chat_completions(req, request, state)

    app.include_router(tokenizer_router(state))

    @app.post("/v1/responses")  # the Responses API on the chat path (engine.server.responses)
    async def respond(req: ResponsesRequest, request: Request):
        return await create_response(req, request, state)

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> Response:
        return not_stored(response_id).response()

    @app.post("/v1/completions")
    async def complete(req: CompletionRequest, request: Request):
        return await completions(req, request, state)

    return app


def create_app(config: ServerConfig) -> FastAPI:
    """Load the model named in `config` and return the app serving it."""
    from engine import LLM

    return build_app(LLM(**config.llm_kwargs()), config)
