"""The sandbox's HTTP shell: thin Litestar routes over the pure ledger and script, with switchable faults."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import uvicorn
from litestar import Litestar, Request, Response, delete, get, post, put
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException, ValidationException
from litestar.middleware import ASGIMiddleware
from litestar.params import FromPath, FromQuery
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from crashsafe.sandbox import chat, scripted_model
from crashsafe.sandbox.books import SqliteBooks
from crashsafe.sandbox.errors import CardDeclined, ErrorCode, InvalidRequest, KeyInUse, SandboxError
from crashsafe.sandbox.faults import (
    AfterCommit,
    BeforeHandling,
    ChargeFate,
    FaultBoard,
    FaultSpec,
    FaultTarget,
    Refusal,
)
from crashsafe.sandbox.ledger import KEY_RETENTION, Outcome, SandboxLedger, check_idempotency_key
from crashsafe.sandbox.listing import LEDGER_PATH
from crashsafe.sandbox.records import (
    AuditBatch,
    AuditRecords,
    BookingRequest,
    CrmUpdateRequest,
    EffectKind,
    EmailRequest,
    GuestPayments,
    HotelSearch,
    Payment,
    PaymentRequest,
    RefundBody,
    RefundRequest,
    ReleaseRequest,
)

IDEMPOTENCY_KEY_HEADER = "idempotency-key"
ACCOUNT_HEADER = "provider-account"  # which account a request acts in (a real provider's per-account key)
REPLAYED_HEADER = "Idempotent-Replayed"
FAULT_TARGET = "fault_target"  # route handler `opt` key naming the endpoint group faults aim at

# One table from error code to HTTP status; nothing else in the sandbox picks a status for an error.
STATUS_BY_CODE: dict[ErrorCode, int] = {
    ErrorCode.MISSING_IDEMPOTENCY_KEY: 400,
    ErrorCode.STREAMING_UNSUPPORTED: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.HOTEL_NOT_FOUND: 404,
    ErrorCode.BOOKING_NOT_FOUND: 404,
    ErrorCode.PAYMENT_NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.HOTEL_UNAVAILABLE: 409,
    ErrorCode.BOOKING_RELEASED: 409,
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.INVALID_DATES: 422,
    ErrorCode.AMOUNT_MISMATCH: 422,
    ErrorCode.CURRENCY_MISMATCH: 422,
    ErrorCode.GUEST_MISMATCH: 422,
    ErrorCode.REFUND_EXCEEDS_PAYMENT: 422,
    ErrorCode.INJECTED_FAULT: 503,
    ErrorCode.KEY_NOT_FOUND: 404,
    ErrorCode.KEY_EXPIRED: 410,
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: 409,
    ErrorCode.CARD_DECLINED: 402,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.EVENT_ID_CONFLICT: 409,
}

# The endpoints that write, and so claim their Idempotency-Key while a request is in progress.
WRITE_TARGETS = frozenset({FaultTarget.PAYMENTS, FaultTarget.BOOKINGS, FaultTarget.EMAILS, FaultTarget.CRM})

# What a load balancer in front of the provider says for a route it does not know: not the provider's shape.
GATEWAY_404 = b"<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>"

# A body that starts like JSON and stops: what a proxy cutting a response short looks like.
MALFORMED_BODY = b'{"status": "ok", "data": {"id": '

_encoder = msgspec.json.Encoder()
T = TypeVar("T")


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(
        _encoder.encode(payload), status_code=status, media_type="application/json", headers=headers
    )


def _decode(raw: bytes, body_type: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=body_type)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(ErrorCode.INVALID_REQUEST, f"Fix the request body: {exc}.") from None
    except msgspec.DecodeError:
        raise InvalidRequest(ErrorCode.INVALID_REQUEST, "The request body must be a JSON object.") from None


def _written(outcome: Outcome[Any], created: int = 201) -> Response[bytes]:
    headers = {REPLAYED_HEADER: "true"} if outcome.replayed else None
    record = outcome.record
    if isinstance(record, Payment) and record.status == ChargeFate.DECLINED:
        # A declined charge is a record (the lookup finds it, declined) answered as a refusal, replays too.
        error = CardDeclined(record.payment_id, record.key)
        return _json(error.to_body(), STATUS_BY_CODE[error.code], headers)
    if isinstance(record, Payment) and record.status == ChargeFate.PENDING:
        return _json(record, 202, headers)
    return _json(record, 200 if outcome.replayed else created, headers)


async def _key_and_body(
    request: Request[Any, Any, Any], body_type: type[T], empty: T | None = None
) -> tuple[str, T]:
    # The key is checked before the body so a keyless write is always a 400, whatever it carries.
    key = check_idempotency_key(request.headers.get(IDEMPOTENCY_KEY_HEADER))
    raw = await request.body()
    body = empty if not raw.strip() and empty is not None else _decode(raw, body_type)
    # The account is the header's alone: a body naming one acts in the header's account all the same.
    return key, msgspec.structs.replace(body, account=_account(request))  # type: ignore[type-var]


def _account(request: Request[Any, Any, Any]) -> str:
    """The provider account a request acts in: its `Provider-Account` header, else the default account."""
    return str(request.headers.get(ACCOUNT_HEADER) or "")


def _sandbox_error(_: Request[Any, Any, Any], exc: SandboxError) -> Response[bytes]:
    return _json(exc.to_body(), STATUS_BY_CODE[exc.code])


def _http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    # Litestar's own refusals (unknown route, bad query) get the same error shape as ours.
    code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code)
    status = exc.status_code
    if code is None or isinstance(exc, ValidationException):
        code, status = ErrorCode.INVALID_REQUEST, 422
    return _json(
        {"error": {"type": "invalid_request_error", "code": code.value, "message": str(exc.detail)}}, status
    )


class FaultInjection(ASGIMiddleware):
    """The provider's front door: claims a write's key while it is in progress (a second request with it
    answers 409 `idempotency_key_in_use`), and applies the armed faults around the handler: refusals,
    latency and slow commits before it, drops and bad bodies after. A request whose caller hangs up is
    still carried out: its body is read first, and the handler runs to the end whoever is listening."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, board: FaultBoard) -> None:
        self.board = board
        self.in_flight: set[tuple[FaultTarget, str]] = set()

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        target: FaultTarget | None = scope["route_handler"].opt.get(FAULT_TARGET)
        claim = _write_claim(scope, target)
        if target is None or (claim is None and not self.board.armed):
            await next_app(scope, receive, send)  # the benchmark path: nothing armed, nothing wrapped
            return
        before = self.board.before(target)
        if before.latency_ms and claim is None:
            await asyncio.sleep(before.latency_ms / 1000)
        if before.refusal is Refusal.FAIL_5XX:
            await _send_now(send, 503, _injected_fault(target))
            return
        if before.refusal is Refusal.THROTTLE:
            await _send_now(send, 429, _throttled(before.retry_after_s), retry_after=before.retry_after_s)
            return
        if before.refusal is Refusal.ROUTE_404:
            await _send_now(send, 404, GATEWAY_404, content_type=b"text/html")
            return
        if claim is not None:
            if claim in self.in_flight:
                await _send_now(send, 409, KeyInUse(claim[1]).to_body())
                return
            self.in_flight.add(claim)
        # Shielded: a caller that hangs up (or a cancelled read) never stops a write half-way.
        await asyncio.shield(self._carried_out(scope, receive, send, next_app, target, claim, before))

    async def _carried_out(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        next_app: ASGIApp,
        target: FaultTarget,
        claim: tuple[FaultTarget, str] | None,
        before: BeforeHandling,
    ) -> None:
        connection = receive  # uvicorn's own: what aborting the connection needs
        try:
            if claim is not None:
                receive = await _buffered(receive)
                delay_ms = before.latency_ms + before.commit_delay_ms
                if delay_ms:
                    await asyncio.sleep(delay_ms / 1000)
            await self._handled(scope, receive, send, next_app, target, connection)
        finally:
            if claim is not None:
                self.in_flight.discard(claim)

    async def _handled(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        next_app: ASGIApp,
        target: FaultTarget,
        connection: Receive,
    ) -> None:
        if not self.board.armed:
            await next_app(scope, receive, send)
            return
        action = AfterCommit.DELIVER

        async def faulty_send(message: Message) -> None:
            nonlocal action
            if message["type"] == "http.response.start":
                # Only a success has committed anything; refusals are always delivered.
                if message["status"] < 400:
                    action = self.board.after_commit(target)
                if action is AfterCommit.DROP:
                    await _drop_connection(connection)
                    return
                if action is AfterCommit.MALFORMED:
                    headers = [
                        (b"content-type", b"application/json"),
                        (b"content-length", b"%d" % len(MALFORMED_BODY)),
                    ]
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    return
            elif action is AfterCommit.DROP:
                return
            elif action is AfterCommit.MALFORMED:
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": MALFORMED_BODY, "more_body": False})
                return
            await send(message)

        await next_app(scope, receive, faulty_send)
        if action is AfterCommit.DROP:
            await _await_disconnect(receive)


def _write_claim(scope: Scope, target: FaultTarget | None) -> tuple[FaultTarget, str] | None:
    """(endpoint group, key) of a keyed write; None for reads, lookups and keyless requests."""
    if target not in WRITE_TARGETS or scope.get("method") != "POST":
        return None
    for name, value in scope.get("headers", ()):
        if name == IDEMPOTENCY_KEY_HEADER.encode():
            return target, value.decode("latin-1")  # type: ignore[return-value]
    return None


async def _buffered(receive: Receive) -> Receive:
    """Read the whole request body now, and hand the handler a `receive` that gives it back: a body read
    after the caller hung up would fail, and the provider would drop a request it had already accepted."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    replayed = False

    async def again() -> Any:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        return await receive()

    return again


def _throttled(retry_after_s: int) -> dict[str, Any]:
    return {
        "error": {
            "type": "rate_limit_error",
            "code": ErrorCode.RATE_LIMITED.value,
            "message": f"Too many requests; nothing was done. Retry after {retry_after_s} s.",
        }
    }


def _injected_fault(target: FaultTarget | None) -> dict[str, Any]:
    return {
        "error": {
            "type": "api_error",
            "code": ErrorCode.INJECTED_FAULT.value,
            "message": "Injected fault: the sandbox refused this request before doing anything; retrying is safe.",
            "target": target.value if target else None,
        }
    }


async def _send_now(
    send: Send,
    status: int,
    payload: Any,
    *,
    content_type: bytes = b"application/json",
    retry_after: int | None = None,
) -> None:
    body = payload if isinstance(payload, bytes) else _encoder.encode(payload)
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if retry_after is not None:
        headers.append((b"retry-after", b"%d" % retry_after))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _drop_connection(receive: Receive) -> None:
    """Lose the response after the effect committed.

    Under uvicorn the ASGI `receive` is a bound method of the request cycle, which holds the TCP
    transport; aborting it closes the socket with no HTTP response at all, so the client fails at
    once ("server disconnected") instead of waiting for a timeout. ASGI itself has no way to say
    "abort", so on any other server we fall back to hanging (cancellable) until the caller gives up.
    """
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    if transport is not None and hasattr(transport, "abort"):
        transport.abort()
        return
    await asyncio.sleep(3600)


async def _await_disconnect(receive: Receive) -> None:
    # Returning before the server has noticed the abort would make uvicorn log "returned without
    # starting response" and write a 500 into the dead socket; waiting for the disconnect message
    # is the server's own signal that it has seen the connection go.
    while (await receive())["type"] != "http.disconnect":
        pass


def _utc_now() -> datetime:
    return datetime.now(UTC)


def build_app(ledger: SandboxLedger | None = None, faults: FaultBoard | None = None) -> Litestar:
    """The sandbox as an ASGI app; pass a ledger to inspect or pre-seed state, or to make it durable."""
    books = ledger if ledger is not None else SandboxLedger(now=_utc_now)
    board = faults if faults is not None else FaultBoard()

    front_door = FaultInjection(board)

    def target(name: FaultTarget) -> dict[str, Any]:
        return {FAULT_TARGET: name}

    # Provider endpoints

    @get("/hotels/search", opt=target(FaultTarget.SEARCH))
    async def search_hotels(
        city: FromQuery[str], check_in: FromQuery[str | None] = None, check_out: FromQuery[str | None] = None
    ) -> Response[bytes]:
        return _json(HotelSearch(hotels=books.search(city, check_in, check_out)))

    @post("/bookings", opt=target(FaultTarget.BOOKINGS))
    async def create_booking(request: Request[Any, Any, Any]) -> Response[bytes]:
        key, body = await _key_and_body(request, BookingRequest)
        return _written(books.create_booking(key, body))

    @post("/bookings/{booking_id:str}/release", opt=target(FaultTarget.BOOKINGS))
    async def release_booking(request: Request[Any, Any, Any], booking_id: FromPath[str]) -> Response[bytes]:
        key = check_idempotency_key(request.headers.get(IDEMPOTENCY_KEY_HEADER))
        released = ReleaseRequest(booking_id=booking_id, account=_account(request))
        return _written(books.release_booking(key, released), created=200)

    @post("/payments", opt=target(FaultTarget.PAYMENTS))
    async def create_payment(request: Request[Any, Any, Any]) -> Response[bytes]:
        key, body = await _key_and_body(request, PaymentRequest)
        fate, pending_ms = board.charge_fate()
        return _written(books.create_payment(key, body, fate, timedelta(milliseconds=pending_ms)))

    @get("/payments")  # a read of the ledger: faults are armed on the writes
    async def find_payments(request: Request[Any, Any, Any], guest_id: FromQuery[str]) -> Response[bytes]:
        # Only the named guest's payments in the caller's account: the caller (the support agent's prepare)
        # names the run's own guest, and another account's guest of the same id is not this one.
        return _json(GuestPayments(payments=books.payments_of(guest_id, _account(request))))

    @post("/payments/{payment_id:str}/refund", opt=target(FaultTarget.PAYMENTS))
    async def refund_payment(request: Request[Any, Any, Any], payment_id: FromPath[str]) -> Response[bytes]:
        key, body = await _key_and_body(request, RefundBody, empty=RefundBody())
        refund = RefundRequest(payment_id, body.amount_cents, account=body.account)
        return _written(books.refund_payment(key, refund))

    @post("/emails", opt=target(FaultTarget.EMAILS))
    async def send_email(request: Request[Any, Any, Any]) -> Response[bytes]:
        key, body = await _key_and_body(request, EmailRequest)
        return _written(books.send_email(key, body))

    @post("/crm/updates", opt=target(FaultTarget.CRM))
    async def update_crm(request: Request[Any, Any, Any]) -> Response[bytes]:
        key, body = await _key_and_body(request, CrmUpdateRequest)
        return _written(books.update_crm(key, body))

    # The audit trail: deduplicated by event id, so no Idempotency-Key is needed (a sent one is ignored) and
    # re-posting any batch is harmless. Not a claimed write: two posts of one run's events may overlap.

    @post("/audit/records", opt=target(FaultTarget.AUDIT), status_code=200)
    async def record_audit(request: Request[Any, Any, Any]) -> Response[bytes]:
        return _json(books.record_audit(_decode(await request.body(), AuditBatch)))

    @get("/audit/records")  # a read: faults are armed on the write
    async def audit_records(run_id: FromQuery[str]) -> Response[bytes]:
        return _json(AuditRecords(records=books.audit_records(run_id)))

    # Reconciliation: "did my write with this key happen?"

    def lookup(path: str, kind: EffectKind) -> Any:
        @get(path, opt=target(FaultTarget.LOOKUPS), name=f"lookup-{kind.value}")
        async def by_key(request: Request[Any, Any, Any], key: FromPath[str]) -> Response[bytes]:
            # Asked in the request's account: another account's key is no key here (its records stay its own).
            lag = timedelta(milliseconds=board.lookup_lag_ms())
            return _json(books.lookup(kind, key, lag, _account(request)))

        return by_key

    lookups = [
        lookup("/bookings/by-key/{key:str}", EffectKind.BOOKING),
        lookup("/booking-releases/by-key/{key:str}", EffectKind.BOOKING_RELEASE),
        lookup("/payments/by-key/{key:str}", EffectKind.CHARGE),
        lookup("/refunds/by-key/{key:str}", EffectKind.REFUND),
        lookup("/emails/by-key/{key:str}", EffectKind.EMAIL),
        lookup("/crm/updates/by-key/{key:str}", EffectKind.CRM_UPDATE),
    ]

    # The model

    @post("/v1/responses", opt=target(FaultTarget.MODEL), status_code=200)
    async def create_response(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = _decode(await request.body(), dict[str, Any])
        if body.get("stream"):
            raise SandboxError(
                ErrorCode.STREAMING_UNSUPPORTED, "The scripted model does not stream; omit stream."
            )
        raw_input = body.get("input")
        if not isinstance(raw_input, str | list) or (
            isinstance(raw_input, list) and not all(isinstance(item, dict) for item in raw_input)
        ):
            raise InvalidRequest(
                ErrorCode.INVALID_REQUEST, "input must be a string or a list of input items."
            )
        tools = body.get("tools")
        return _json(
            scripted_model.respond(
                raw_input,
                tools if isinstance(tools, list) else None,
                model=str(body.get("model") or scripted_model.MODEL_NAME),
            )
        )

    @post("/v1/chat/completions", opt=target(FaultTarget.MODEL), status_code=200)
    async def create_chat_completion(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = _decode(await request.body(), dict[str, Any])
        if body.get("stream"):
            raise SandboxError(
                ErrorCode.STREAMING_UNSUPPORTED, "The scripted model does not stream; omit stream."
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidRequest(ErrorCode.INVALID_REQUEST, "messages must be a list of message objects.")
        tools = body.get("tools")
        return _json(
            chat.respond(
                messages,
                tools if isinstance(tools, list) else None,
                model=str(body.get("model") or scripted_model.MODEL_NAME),
            )
        )

    @get("/v1/models", opt=target(FaultTarget.MODEL))
    async def list_models() -> Response[bytes]:
        model = {
            "id": scripted_model.MODEL_NAME,
            "object": "model",
            "created": 0,
            "owned_by": "crashsafe-sandbox",
        }
        return _json({"object": "list", "data": [model]})

    # Test controls: never faulted

    @get(LEDGER_PATH)
    async def read_ledger(guest_id: FromQuery[str | None] = None) -> Response[bytes]:
        return _json(books.view(guest_id))

    @get("/_faults")
    async def read_faults() -> Response[bytes]:
        # Also the keys whose write is in progress, so a test can wait for a request to be in the provider's hands.
        in_flight = sorted(key for _, key in front_door.in_flight)
        return _json({"faults": board.snapshot(), "in_flight": in_flight})

    @put("/_faults")
    async def arm_faults(request: Request[Any, Any, Any]) -> Response[bytes]:
        board.arm(_decode(await request.body(), FaultSpec))
        return _json({"faults": board.snapshot()})

    @delete("/_faults", status_code=200)
    async def clear_faults() -> Response[bytes]:
        board.clear()
        return _json({"faults": board.snapshot()})

    @post("/_reset", status_code=200)
    async def reset() -> Response[bytes]:
        books.reset()
        board.clear()
        return _json({"reset": True})

    return Litestar(
        route_handlers=[
            search_hotels,
            create_booking,
            release_booking,
            create_payment,
            refund_payment,
            find_payments,
            send_email,
            update_crm,
            record_audit,
            audit_records,
            *lookups,
            create_response,
            create_chat_completion,
            list_models,
            read_ledger,
            read_faults,
            arm_faults,
            clear_faults,
            reset,
        ],
        exception_handlers={SandboxError: _sandbox_error, HTTPException: _http_error},
        middleware=[front_door],
        state=State({"ledger": books, "faults": board}),
        openapi_config=None,
        logging_config=None,
    )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP explicitly: asyncio only sets TCP_NODELAY on sockets whose proto is
    # IPPROTO_TCP, and without it every response waits ~40 ms on Nagle and delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    ready: Callable[[int], None] | None = None,
    *,
    ledger: SandboxLedger | None = None,
    data_dir: Path | None = None,
    key_retention: timedelta = KEY_RETENTION,
) -> None:
    """Run the sandbox until cancelled (or SIGINT/SIGTERM); `port=0` picks a free port, given to `ready`.

    With `data_dir` the books are durable (SQLite there): a killed, restarted sandbox remembers every
    effect and key, as a real provider does. Without, they live in memory. Keys are kept `key_retention`."""
    durable = SqliteBooks.in_dir(data_dir) if data_dir is not None and ledger is None else None
    if ledger is None:
        ledger = SandboxLedger(now=_utc_now, books=durable, retention=key_retention)
    # Binding and listening ourselves makes the real port known before uvicorn starts, and
    # announcing it then is truthful: the kernel queues connections until uvicorn accepts them.
    config = uvicorn.Config(
        build_app(ledger),
        log_level="warning",
        access_log=False,
        lifespan="off",
        # A hung fallback drop must not hold shutdown hostage.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    sock = _listen(host, port)
    try:
        bound = sock.getsockname()[1]
        print(f"sandbox listening on http://{host}:{bound}", flush=True)
        if ready is not None:
            ready(bound)
    except BaseException:
        sock.close()
        raise
    # uvicorn closes the socket on shutdown.
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        # Cancelling the caller must still close the listener and connections cleanly.
        server.should_exit = True
        await serving
        raise
    finally:
        if durable is not None:
            durable.close()
