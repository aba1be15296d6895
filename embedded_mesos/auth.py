"""Authentication of the embedded cluster's public APIs: frameworks and executors.

Owns the two checks a Mesos master and agent make before serving their v1 APIs, as pure
functions and small values (the HTTP handlers in `master` and `agent` call them):

- Framework authentication (Mesos's `--authenticate_http_frameworks` with the basic
  authenticator): a scheduler call must carry `Authorization: Basic base64(principal:secret)`
  for a configured credential; the secret is compared in constant time. `FrameworkCredential`
  is one principal and its secret (its repr hides the secret); `new_framework_credential`
  makes one with 256 random bits, as a master does at start.
- Executor authentication (Mesos's `--authenticate_http_executors`): the agent signs, with a key
  only it holds (`ExecutorTokens`, HMAC-SHA256, a JWT of type HS256), a token naming the
  framework, the executor and the container (one executor launch: a fresh random id), hands it
  to that executor alone in `EXECUTOR_TOKEN_ENV`, and accepts an executor call only with
  `Authorization: Bearer <token>` whose signature holds and whose claims name the addressed
  framework, executor and current container.

It does no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field

REALM = "mesos"
BASIC_CHALLENGE = f'Basic realm="{REALM}"'
BEARER_CHALLENGE = f'Bearer realm="{REALM}"'
EXECUTOR_TOKEN_ENV = "MESOS_EXECUTOR_AUTHENTICATION_TOKEN"
FRAMEWORK_SECRET_ENV = "ELASTIQ_EMBEDDED_FRAMEWORK_SECRET"  # standalone master: the secret
DEFAULT_PRINCIPAL = "elastiq"
_JWT_HEADER = {"alg": "HS256", "typ": "JWT"}
MAX_TOKEN_CHARS = 4096  # longer Authorization values are refused unparsed


@dataclass(frozen=True)
class FrameworkCredential:
    """A framework principal and its secret (printable ASCII without ':' in the principal,
    as HTTP Basic needs)."""

    principal: str
    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.principal or ":" in self.principal or not _printable(self.principal):
            raise ValueError("a framework principal must be printable ASCII without ':'")
        if not self.secret or not _printable(self.secret):
            raise ValueError("a framework secret must be non-empty printable ASCII")


def _printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


def new_framework_credential(principal: str = DEFAULT_PRINCIPAL) -> FrameworkCredential:
    """A fresh credential: `principal` with a secret of 256 random bits (URL-safe text)."""
    return FrameworkCredential(principal, secrets.token_urlsafe(32))


def basic_authorization(credential: FrameworkCredential) -> str:
    """The `Authorization` header value HTTP Basic sends for `credential`."""
    pair = f"{credential.principal}:{credential.secret}".encode("ascii")
    return "Basic " + base64.b64encode(pair).decode("ascii")


def authenticated_principal(authorization: str | None,
                            credentials: tuple[FrameworkCredential, ...]) -> str | None:
    """The principal an `Authorization: Basic` header proves, or None (missing, malformed,
    unknown principal or wrong secret). Every credential's secret is compared in constant
    time, whether or not its principal matches."""
    pair = _basic_pair(authorization)
    if pair is None:
        return None
    principal, secret = pair
    found = None
    for credential in credentials:
        same_secret = hmac.compare_digest(secret, credential.secret.encode("ascii"))
        if same_secret and hmac.compare_digest(principal, credential.principal.encode("ascii")):
            found = credential.principal
    return found


def _basic_pair(authorization: str | None) -> tuple[bytes, bytes] | None:
    if not authorization or len(authorization) > MAX_TOKEN_CHARS:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    principal, colon, secret = decoded.partition(b":")
    return (principal, secret) if colon else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization or len(authorization) > MAX_TOKEN_CHARS:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    token = value.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class ExecutorClaims:
    """Whom an executor token was made for: one launch of one executor of one framework."""

    framework_id: str
    executor_id: str
    container_id: str


class ExecutorTokens:
    """Makes and checks executor tokens with one agent's signing key (random unless given)."""

    def __init__(self, key: bytes | None = None):
        self._key = key or secrets.token_bytes(32)

    def mint(self, claims: ExecutorClaims) -> str:
        """A token (`header.payload.signature`, base64url, HS256) carrying `claims`."""
        payload = {"fid": claims.framework_id, "eid": claims.executor_id,
                   "cid": claims.container_id}
        signing_input = _b64(_canonical(_JWT_HEADER)) + "." + _b64(_canonical(payload))
        return signing_input + "." + _b64(self._sign(signing_input))

    def verify(self, token: str) -> ExecutorClaims | None:
        """The claims of a token this key signed, or None (malformed or forged)."""
        parts = token.split(".")
        if len(parts) != 3 or len(token) > MAX_TOKEN_CHARS:
            return None
        signing_input = parts[0] + "." + parts[1]
        signature = _unb64(parts[2])
        if signature is None or not hmac.compare_digest(signature, self._sign(signing_input)):
            return None
        header, payload = _json_object(parts[0]), _json_object(parts[1])
        if header != _JWT_HEADER or payload is None:
            return None
        values = [value for value in (payload.get(name) for name in ("fid", "eid", "cid"))
                  if isinstance(value, str) and value]
        if len(values) != 3:
            return None
        return ExecutorClaims(*values)

    def _sign(self, signing_input: str) -> bytes:
        return hmac.new(self._key, signing_input.encode("ascii"), hashlib.sha256).digest()


def claims_mismatch(claims: ExecutorClaims, framework_id: str, executor_id: str) -> str | None:
    """Why a token with `claims` may not make a call for (`framework_id`, `executor_id`), or
    None when it may (the container is checked against the running executor separately)."""
    if claims.framework_id != framework_id or claims.executor_id != executor_id:
        return (f"the token is for executor {claims.executor_id} of framework "
                f"{claims.framework_id}, not executor {executor_id} of framework {framework_id}")
    return None


def _canonical(value: dict[str, str]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _json_object(text: str) -> dict | None:
    data = _unb64(text)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None
