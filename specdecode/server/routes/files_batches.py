"""The routes of OpenAI's Files and Batches APIs: `/v1/files` (upload, list, read, delete) and `/v1/batches` (create,
list, read, cancel). What they keep: file_store.py and batches.py.

A server that keeps no files (`serve --files-store 0`, or `--replicas`, whose replicas share no memory) answers the
routes that would add or list files or batches with a 400 naming the flag, and a read of one id with a 404.

An upload is `multipart/form-data`, which a browser sends cross-origin without a CORS preflight: an upload whose
`Origin` is not the server's own is refused (403), so a web page cannot fill a keyless server's store.
"""
from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TypeVar
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from specdecode.server.protocol.bodies import read_body, require_json
from specdecode.server.protocol.errors import APIError, bad_request, from_validation, shown
from specdecode.server.protocol.pages import page, page_query
from specdecode.server.stores.batches import ENDED, BatchCreate, Batches, BatchJob
from specdecode.server.stores.file_store import PURPOSES, FileStore, StoredFile

_Kept = TypeVar("_Kept", FileStore, Batches)
UPLOAD_OVERHEAD = 64 << 10  # a multipart body's bytes beyond the file's: boundaries, headers, the purpose field
BATCH_BODY_BYTES = 64 << 10  # a batch's create body: ids, an endpoint and at most 16 metadata pairs
FILES_PAGE, BATCHES_PAGE = 10_000, 100  # the most a list returns (OpenAI's bounds); BATCHES_PAGE's default is 20

# the routes' request bodies in OpenAPI terms (the handlers read them themselves, for this API's own 4xx)
UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"enum": list(PURPOSES)}}}}}}}
CREATE_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/BatchCreate"}}}}}


def add_batch_routes(app: FastAPI, files: FileStore | None, batches: Batches | None, dependencies: list,
                     timeout_s: float) -> None:
    """timeout_s: the most an upload's or a create body's arrival may take."""

    @app.post("/v1/files", dependencies=dependencies, openapi_extra=UPLOAD_BODY)
    async def upload(request: Request) -> Response:
        return await _upload(request, _kept(files), timeout_s)

    @app.get("/v1/files", dependencies=dependencies)
    async def list_files(request: Request) -> dict:
        query = request.query_params
        asked = page_query(query, FILES_PAGE, FILES_PAGE, "files", extra=("purpose",))
        purpose = query.get("purpose")
        return page([held.card() for held in _kept(files).held() if purpose in (None, held.purpose)], asked, "files")

    @app.get("/v1/files/{file_id}", dependencies=dependencies)
    async def file(file_id: str) -> dict:
        return _file(files, file_id).card()

    @app.get("/v1/files/{file_id}/content", dependencies=dependencies)
    async def file_content(file_id: str) -> Response:
        return Response(_file(files, file_id).data, media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}", dependencies=dependencies)
    async def delete_file(file_id: str) -> dict:
        if files is None or not files.delete(file_id):
            raise _no_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @app.post("/v1/batches", dependencies=dependencies, openapi_extra=CREATE_BODY)
    async def create_batch(request: Request) -> Response:
        return await _create(request, _kept(batches), timeout_s)

    @app.get("/v1/batches", dependencies=dependencies)
    async def list_batches(request: Request) -> dict:
        asked = page_query(request.query_params, 20, BATCHES_PAGE, "batches")
        return page([job.card() for job in _kept(batches).held()], asked, "batches")

    @app.get("/v1/batches/{batch_id}", dependencies=dependencies)
    async def batch(batch_id: str) -> dict:
        return _batch(batches, batch_id).card()

    @app.post("/v1/batches/{batch_id}/cancel", dependencies=dependencies)
    async def cancel_batch(batch_id: str) -> dict:
        job = _batch(batches, batch_id)
        if job.status in ENDED and job.status != "cancelled":
            raise APIError(409, f"batch {batch_id} has ended ({job.status}); only a running batch can be cancelled",
                           code="batch_ended")
        batches.cancel(job)  # type: ignore[union-attr]  # _batch found it, so batches is not None
        return job.card()


async def _upload(request: Request, files: FileStore, timeout_s: float) -> Response:
    """POST /v1/files: one file, purpose "batch", as multipart/form-data."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "multipart/form-data":
        raise APIError(415, f"an upload is multipart/form-data with the fields file and purpose; got "
                            f"{shown(media_type) if media_type else 'no Content-Type'}", code="unsupported_media_type")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower():
        raise APIError(403, f"an upload from another origin ({shown(origin)}) is refused", "permission_error",
                       code="cross_origin")
    limit = files.room() + UPLOAD_OVERHEAD  # the file cannot be larger
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _no_room(files, f"{declared} bytes with its form")
    # held aside while it is read: its declared size, or what has arrived of one that declares none
    with files.reserve(int(declared) if declared.isdigit() else 0, slack=UPLOAD_OVERHEAD) as grow:
        def arrived(size: int) -> None:
            if not grow(size):
                raise _no_room(files, f"over {size - 1} bytes with its form, still arriving")
        filename, purpose, data = await _read_upload(request, limit, timeout_s, files,
                                                     None if declared.isdigit() else arrived)
    if len(data) > files.room():
        raise _no_room(files, f"{len(data)} bytes")
    return JSONResponse(files.add(filename, purpose, data).card())


async def _read_upload(request: Request, limit: int, timeout_s: float, files: FileStore,
                       arrived: Callable[[int], None] | None) -> tuple[str, str, bytes]:
    """The upload's (filename, purpose, file bytes), its form checked; a body over `limit` is a 413."""
    try:
        body = await read_body(request, limit, timeout_s, arrived)
    except APIError as error:
        raise (_no_room(files, "larger than that") if error.code == "request_too_large" else error) from None

    async def once() -> AsyncGenerator[bytes, None]:
        yield body
    try:
        form = await MultiPartParser(request.headers, once(), max_files=1, max_fields=4).parse()
    except MultiPartException as error:
        raise bad_request(f"the upload is not a readable multipart form: {error.message}", "file") from None
    try:
        unknown = sorted(set(form.keys()) - {"file", "purpose"})
        if unknown:
            raise bad_request(f"{unknown[0]} is not supported; send the fields file and purpose", unknown[0],
                              "unsupported")
        purpose, upload = form.get("purpose"), form.get("file")
        if not isinstance(purpose, str) or purpose not in PURPOSES:
            raise bad_request(f"purpose must be one of {', '.join(PURPOSES)} (the files this server reads), got "
                              f"{shown(purpose)}", "purpose", "invalid_value")
        if not isinstance(upload, UploadFile):
            raise bad_request("file must be a file part (a form field with a filename)", "file", "invalid_value")
        data = await upload.read()
    finally:
        await form.close()
    return upload.filename or "upload.jsonl", purpose, data


async def _create(request: Request, batches: Batches, timeout_s: float) -> Response:
    """POST /v1/batches."""
    require_json(request)
    raw = await read_body(request, BATCH_BODY_BYTES, timeout_s)
    try:
        body = BatchCreate.model_validate_json(raw)
    except ValidationError as error:
        raise from_validation(error) from None
    return JSONResponse((await batches.create(body, request.app)).card())


def _no_room(files: FileStore, size: str) -> APIError:
    reading = f" ({files.reserved} held for uploads being read)" if files.reserved else ""
    return APIError(413, f"the file is {size}, and the file store has {files.room()} of {files.capacity} bytes "
                         f"free{reading}: delete files (DELETE /v1/files/ID) or serve with a larger --files-store",
                    param="file",
                    code="file_store_full")


def _kept(store: _Kept | None) -> _Kept:
    if store is None:
        raise bad_request("this server keeps no files or batches (serve --files-store SIZE; with --replicas there "
                          "are none, as replicas share no memory)", None, "unsupported")
    return store


def _file(files: FileStore | None, file_id: str) -> StoredFile:
    held = files.get(file_id) if files is not None else None
    if held is None:
        raise _no_file(file_id)
    return held


def _no_file(file_id: str) -> APIError:
    return APIError(404, f"no file with id {shown(file_id)} is held here", "not_found_error", param="file_id",
                    code="not_found")


def _batch(batches: Batches | None, batch_id: str) -> BatchJob:
    job = batches.get(batch_id) if batches is not None else None
    if job is None:
        raise APIError(404, f"no batch with id {shown(batch_id)} is held here", "not_found_error", param="batch_id",
                       code="not_found")
    return job
