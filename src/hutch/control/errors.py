"""The management API's error answers, as RabbitMQ gives them: a status and `{"error", "reason"}`.

AMQP errors raised by the broker while a handler works map onto HTTP the way RabbitMQ's
management plugin maps a failed operation on its internal channel: ACCESS_REFUSED is 401
`not_authorised`, NOT_FOUND is 404 `not_found`, anything else 400 `bad_request`, with the
AMQP reply text ("PRECONDITION_FAILED - inequivalent arg ...") as the reason.

Whatever else goes wrong in a handler is still answered in JSON: `error_middleware` turns an
unexpected exception into a 500 `{"error": "internal_server_error", "reason": ...}` and logs
its traceback once, and aiohttp's own HTTP errors (413 body too large, ...) get a JSON body
too. Nothing here may hide a handler's bug: the traceback always reaches the node's log.
"""

from __future__ import annotations

import logging

from aiohttp import web

from hutch.amqp import spec
from hutch.amqp.spec import AMQPError

REALM = 'Basic realm="RabbitMQ Management"'

log = logging.getLogger("hutch.http")


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: object):
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason

    def response(self) -> web.Response:
        headers = {"WWW-Authenticate": REALM} if self.status == 401 else None
        return web.json_response({"error": self.error, "reason": self.reason}, status=self.status,
                                 headers=headers)


def bad_request(reason: object) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def not_authorised(reason: str) -> ApiError:
    return ApiError(401, "not_authorised", reason)


def login_failed() -> ApiError:
    return ApiError(401, "not_authorized", "Login failed")  # RabbitMQ spells it so for this one


def from_amqp(err: AMQPError) -> ApiError:
    text = spec.reply_text(err.code, err.text)
    if err.code == spec.ACCESS_REFUSED:
        return not_authorised(text)
    if err.code == spec.NOT_FOUND:
        return ApiError(404, "not_found", text)
    return bad_request(text)


def service_unavailable(reason: str) -> ApiError:
    return ApiError(503, "service_unavailable", reason)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """The outermost middleware: every failure leaves the server as JSON with a reason."""
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPException as e:
        if e.status < 400:
            raise
        error = (e.reason or "error").lower().replace(" ", "_")
        return web.json_response({"error": error, "reason": e.text or e.reason}, status=e.status,
                                 headers={k: v for k, v in e.headers.items() if k.lower() == "allow"})
    except Exception as e:  # a handler's bug: log it once, answer in JSON
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": "internal_server_error", "reason": f"{type(e).__name__}: {e}"},
                                 status=500)
