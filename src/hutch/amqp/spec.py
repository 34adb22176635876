"""AMQP 0-9-1 constants: frame types, reply codes and the protocol errors hutch raises.

Reply codes and their names follow the AMQP 0-9-1 specification; the reply texts the
broker puts after them follow RabbitMQ ("NOT_FOUND - no queue 'q' in vhost '/'"), because
client libraries and their users match on them. An `AMQPError` carries everything the peer
must be told: the code, the text, and the class/method that caused it. Whether it closes
the channel or the whole connection follows from the code (`is_connection_error`).
"""

from __future__ import annotations

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_HEADER_SIZE = 7
FRAME_MIN_SIZE = 4096  # frames before tune-ok may be at most this big (spec 4.2.3)

# Reply codes (spec 1.7.2; names as RabbitMQ prints them)
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    200: "OK",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}

# Codes that are connection exceptions (spec 1.7.2); the rest close only the channel.
CONNECTION_ERRORS = frozenset({320, 402, 501, 502, 503, 504, 505, 530, 540, 541})

# (class_id, method_id) of the methods that carry content.
BASIC_PUBLISH = (60, 40)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_GET_OK = (60, 71)

SHORTSTR_MAX = 255


def reply_text(code: int, text: str) -> str:
    """"CODE_NAME - text", cut to a short string's 255 bytes with "..." as RabbitMQ does."""
    full = f"{REPLY_NAMES.get(code, str(code))} - {text}"
    raw = full.encode()
    if len(raw) <= SHORTSTR_MAX:
        return full
    return raw[:SHORTSTR_MAX - 3].decode(errors="ignore") + "..."


def is_connection_error(code: int) -> bool:
    return code in CONNECTION_ERRORS


class AMQPError(Exception):
    """A protocol or semantic error the peer must be told about.

    `text` is the human part; `reply_text` prefixes RabbitMQ's code name
    ("NOT_FOUND - no queue 'x' in vhost '/'"). `class_id`/`method_id` name the
    method that failed (0, 0 when none did).
    """

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0):
        super().__init__(f"{REPLY_NAMES.get(code, code)} - {text}")
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        return reply_text(self.code, self.text)

    @property
    def connection_level(self) -> bool:
        return is_connection_error(self.code)

    def on(self, class_id: int, method_id: int) -> AMQPError:
        """Name the method that failed, unless one is named already."""
        if not self.class_id:
            self.class_id, self.method_id = class_id, method_id
        return self


def not_found(text: str) -> AMQPError:
    return AMQPError(NOT_FOUND, text)


def precondition_failed(text: str) -> AMQPError:
    return AMQPError(PRECONDITION_FAILED, text)


def access_refused(text: str) -> AMQPError:
    return AMQPError(ACCESS_REFUSED, text)
