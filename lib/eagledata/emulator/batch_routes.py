"""The Batch API's routes under /moonshot/v1 (Moonshot's shapes, `{"error": {message, type}}` errors) and its admin
routes; the state is `batch.BatchEmulator` (`app.state.batch`)."""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .batch import BatchEmulator
from .batch_requests import BatchError

BASE = "/moonshot/v1"


def _service(request: Request) -> BatchEmulator:
    """The state, once the request's key is checked (any Bearer key, or only the config's `api_key` when set)."""
    svc: BatchEmulator = request.app.state.batch
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise BatchError(401, "Invalid Authentication: no API key was sent (Authorization: Bearer <key>)")
    if svc.em.cfg.api_key is not None and key.strip() != svc.em.cfg.api_key:
        raise BatchError(401, "Invalid Authentication: the API key is not valid")
    return svc


def _api(handler: Callable[[Request, BatchEmulator], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request, _service(request))
        except BatchError as e:
            return JSONResponse(e.body(), status_code=e.status)
    return run


@_api
async def upload(request: Request, svc: BatchEmulator) -> Response:
    try:
        async with request.form(max_files=2, max_fields=10) as form:
            part = form.get("file")
            if not isinstance(part, UploadFile):
                raise BatchError(400, "'file' (a .jsonl upload) is required")
            data = await part.read()
            f = svc.files.upload(svc.cfg, part.filename or "", form.get("purpose"), data, svc.wall(svc.now()))
    except (MultiPartException, AssertionError, KeyError) as e:  # not multipart/form-data, or broken
        raise BatchError(400, f"the body must be multipart/form-data with 'file' and 'purpose': {e}") from None
    return JSONResponse(f.obj())


@_api
async def list_files(request: Request, svc: BatchEmulator) -> Response:
    svc.now()
    return JSONResponse({"object": "list", "data": svc.files.listing()})


@_api
async def get_file(request: Request, svc: BatchEmulator) -> Response:
    svc.now()
    return JSONResponse(svc.files.get(request.path_params["file_id"]).obj())


@_api
async def delete_file(request: Request, svc: BatchEmulator) -> Response:
    svc.now()
    return JSONResponse(svc.files.delete(request.path_params["file_id"]))


@_api
async def file_content(request: Request, svc: BatchEmulator) -> Response:
    svc.now()
    return Response(svc.files.get(request.path_params["file_id"]).data, media_type="application/jsonl")


@_api
async def create_batch(request: Request, svc: BatchEmulator) -> Response:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BatchError(400, "the request body is not valid JSON") from None
    return JSONResponse(svc.create(body))


@_api
async def list_batches(request: Request, svc: BatchEmulator) -> Response:
    return JSONResponse(svc.listing(request.query_params.get("limit"), request.query_params.get("after")))


@_api
async def get_batch(request: Request, svc: BatchEmulator) -> Response:
    now = svc.now()
    return JSONResponse(svc.batch_obj(svc.get(request.path_params["batch_id"]), now))


@_api
async def cancel_batch(request: Request, svc: BatchEmulator) -> Response:
    return JSONResponse(svc.cancel(request.path_params["batch_id"]))


@_api
async def balance(request: Request, svc: BatchEmulator) -> Response:
    svc.now()
    left = svc.available
    return JSONResponse({"code": 0, "data": {"available_balance": left, "voucher_balance": 0, "cash_balance": left},
                         "scode": "0x0", "status": True})


async def admin_expire(request: Request) -> Response:
    svc: BatchEmulator = request.app.state.batch
    try:
        return JSONResponse(svc.expire(request.path_params["batch_id"]))
    except BatchError as e:
        return JSONResponse(e.body(), status_code=e.status)


async def admin_lines(request: Request) -> Response:
    return JSONResponse({"data": request.app.state.batch.lines()})


ROUTES = [
    Route(f"{BASE}/files", upload, methods=["POST"]),
    Route(f"{BASE}/files", list_files, methods=["GET"]),
    Route(f"{BASE}/files/{{file_id}}", get_file, methods=["GET"]),
    Route(f"{BASE}/files/{{file_id}}", delete_file, methods=["DELETE"]),
    Route(f"{BASE}/files/{{file_id}}/content", file_content, methods=["GET"]),
    Route(f"{BASE}/batches", create_batch, methods=["POST"]),
    Route(f"{BASE}/batches", list_batches, methods=["GET"]),
    Route(f"{BASE}/batches/{{batch_id}}", get_batch, methods=["GET"]),
    Route(f"{BASE}/batches/{{batch_id}}/cancel", cancel_batch, methods=["POST"]),
    Route(f"{BASE}/users/me/balance", balance, methods=["GET"]),
    Route("/admin/batches/{batch_id}/expire", admin_expire, methods=["POST"]),
    Route("/admin/batch_lines", admin_lines, methods=["GET"]),
]
