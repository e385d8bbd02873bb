"""One scrubber for everything streambatch says: URLs and options lose their
secrets before they reach a message, a log line, a ``repr``, another rank or
the terminal.

What is masked (with ``***``): URL user-info (``https://user:token@host``),
query values whose key looks secret (``X-Amz-Signature``, ``X-Amz-Credential``,
``X-Goog-Signature``, Azure SAS ``sig``, ``token``, ``key``, ``jwt``, OAuth
``code``, ...), bearer tokens, the values of ``Authorization:`` and other
credential headers (``X-JFrog-Art-Api``, ``Private-Token``, any hyphenated
header name with api/token/key/secret/auth/password/session/cookie in it, in
``pipe:curl -H ...`` commands), the passwords of command-line flags (curl's
``-u``/``--user``/``--proxy-user user:PASSWORD``, wget's ``--password=``,
``--http-password=``, ``--ftp-password=``, ``--proxy-password=``; any long
flag naming a password, token, secret or API key), secret environment
assignments in commands (``AWS_SECRET_ACCESS_KEY=...``), secret-named keys
quoted in a dict's repr (``{'secret': '...'}``), Azure
connection-string keys (``AccountKey=``, ``SharedAccessSignature=``), Hugging
Face tokens (``hf_...``) and AWS access key ids.

Where it applies, so that no formatting site has to remember it:

- ``ShardError`` scrubs its own message (``errors.py``);
- every ``streambatch.*`` logger carries ``ScrubFilter`` (``logger(name)``);
- ``scrub_exception`` scrubs an exception and its whole ``__cause__`` /
  ``__context__`` chain in place (a library's own exception may quote the URL
  it failed on); the public entry points call it before an error leaves them
  (``StreamingBatches`` construction and reading, ``index_shards``,
  ``open_catalog``, the command line);
- other raise sites wrap their message in ``scrub(...)``; a test walks the
  source and checks every site that formats a URL does one of these.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# Option and query keys whose values are secrets.
SECRET_KEY = re.compile(r"(?i)(key|secret|token|passw|credential|signature|^sig$|auth|session|cookie)")
_SECRET_QUERY = re.compile(r"(?i)([?&;][^=&\s'\"]*(?:key|secret|token|passw|credential|signature|sig|auth|"
                           r"session|jwt)[^=&\s'\"]*=)[^&\s'\"]+")
# Query keys that are secrets only as the whole key (an OAuth authorization code; "?statuscode=" is not one).
_SECRET_QUERY_EXACT = re.compile(r"(?i)([?&;](?:code|pwd|pw)=)[^&\s'\"]+")
# Connection-string fields (Azure's "AccountName=a;AccountKey=...;"), also at the start of the text.
_CONNECTION_KEY = re.compile(r"(?i)((?:^|(?<=[\s;'\"]))(?:AccountKey|SharedAccessSignature|SharedAccessKey)=)"
                             r"[^;\s'\"]+")
_USERINFO = re.compile(r"(://)[^/@\s'\"]+@")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_AUTH_HEADER = re.compile(r"(?i)((?:authorization|x-api-key|x-auth-token|cookie)\s*[:=]\s*)[^'\"\n]+")
# "Name: value" where Name is a hyphenated header name that names a credential (X-JFrog-Art-Api,
# Private-Token, X-Goog-Api-Key); plain words ("max_batch_tokens: 4000") and ordinary headers
# (Content-Range) stay readable.
_HEADER = re.compile(r"(?i)(?<![\w-])([a-z][a-z0-9]*(?:-[a-z0-9]+)+)(\s*:\s*)([^'\"\n]+)")
_HEADER_SECRET = re.compile(r"(?i)(api|token|key|secret|auth|passw|session|cookie|signature|credential)")
# curl -u/--user/-U/--proxy-user user:PASSWORD (the user name stays), wget --password=PASSWORD & co.
_USER_FLAG = re.compile(r"(?<![\w-])((?:-u|-U|--user|--proxy-user)(?:\s+|=)?['\"]?[^\s'\":]*:)[^\s'\"]+")
# Long flags whose value is a secret: --password=, --http-password, --http-passwd (wget), --token, --api-key,
# --client-secret, ...
_PASSWORD_FLAG = re.compile(r"(?i)(?<![\w-])(--[\w-]*(?:passw(?:or)?d|token|secret|api-?key|access-key)"
                            r"(?:\s+|=)['\"]?)(?!-)[^\s'\"]+")
# Environment assignments in a shell command: AWS_SECRET_ACCESS_KEY=..., HF_TOKEN=..., PGPASSWORD=...
_ENV_SECRET = re.compile(r"(?<![\w-])([A-Z][A-Z0-9_]*(?:SECRET|TOKEN|PASSWORD|PASSWD|ACCESS_KEY|API_KEY|CREDENTIAL)"
                         r"[A-Z0-9_]*=)['\"]?[^\s'\";]+")
# A secret-named key quoted in a dict's repr: {'secret': 'abc', "token": "xyz"}
_QUOTED_PAIR = re.compile(r"(?i)((['\"])[\w-]*(?:key|secret|token|passw|credential|signature|auth|session|cookie|"
                          r"jwt)[\w-]*\2\s*:\s*)(['\"])(?:(?!\3).)+\3")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")


def scrub(text: Any) -> str:
    """``str(text)`` with every secret this module knows of masked."""
    out = _USERINFO.sub(r"\1" + MASK + "@", str(text))
    out = _SECRET_QUERY.sub(r"\1" + MASK, out)
    out = _SECRET_QUERY_EXACT.sub(r"\1" + MASK, out)
    out = _CONNECTION_KEY.sub(r"\1" + MASK, out)
    out = _AUTH_HEADER.sub(r"\1" + MASK, out)
    out = _HEADER.sub(_header, out)
    out = _USER_FLAG.sub(r"\1" + MASK, out)
    out = _PASSWORD_FLAG.sub(r"\1" + MASK, out)
    out = _ENV_SECRET.sub(r"\1" + MASK, out)
    out = _QUOTED_PAIR.sub(r"\1\3" + MASK + r"\3", out)
    out = _BEARER.sub(r"\1" + MASK, out)
    out = _HF_TOKEN.sub("hf_" + MASK, out)
    return _AWS_KEY_ID.sub(MASK, out)


def secret_header(name: str) -> bool:
    """Is ``name`` an HTTP header that carries a credential (Authorization, Cookie, X-Api-Key,
    X-JFrog-Art-Api, Private-Token, ...)?"""
    return bool(_HEADER_SECRET.search(name))


def _header(m: re.Match) -> str:
    name = m.group(1)
    return m.group(0) if not secret_header(name) else name + m.group(2) + MASK


def scrub_url(url: str) -> str:
    """A URL with user-info and secret-looking query values masked, parsed
    properly (``scrub`` works on any text; this keeps the URL well formed)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL at all (an invalid IPv6 host, say): mask by pattern
        return scrub(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    query = urlencode([(k, MASK if SECRET_KEY.search(k) else v) for k, v in parse_qsl(parts.query, True)],
                      safe="*")
    return scrub(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


def scrub_options(options: Any) -> Any:
    """A copy of ``storage_options`` with secret-looking values masked (for repr and logs)."""
    if isinstance(options, dict):
        return {k: (MASK if isinstance(k, str) and SECRET_KEY.search(k) and v is not None
                    else scrub_options(v)) for k, v in options.items()}
    if isinstance(options, (list, tuple)):
        return type(options)(scrub_options(v) for v in options)
    return scrub(options) if isinstance(options, str) else options


def _scrub_arg(value: Any) -> Any:
    return scrub(value) if isinstance(value, str) else value


def scrub_exception(exc: BaseException) -> BaseException:
    """Scrub ``exc`` and every exception chained to it, in place; returns ``exc``.

    ``args`` (what ``str(exc)`` and tracebacks print) and OSError's
    ``strerror`` / ``filename`` / ``filename2`` are rewritten; an exception
    whose attributes cannot be set is left as it is.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            e.args = tuple(_scrub_arg(a) for a in e.args)
            if isinstance(e, OSError):
                for name in ("strerror", "filename", "filename2"):
                    if isinstance(getattr(e, name, None), str):
                        setattr(e, name, scrub(getattr(e, name)))
        except (AttributeError, TypeError):  # a read-only exception type: nothing to do
            pass
        notes = getattr(e, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [_scrub_arg(n) for n in notes]
        todo += [e.__cause__, e.__context__]
    return exc


F = TypeVar("F", bound=Callable[..., Any])


def scrubbing(fn: F) -> F:
    """Decorate a public entry point: whatever it raises leaves it scrubbed
    (``scrub_exception``), with its traceback intact."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            scrub_exception(exc)
            raise

    return wrapper  # type: ignore[return-value]


class ScrubFilter(logging.Filter):
    """Scrubs a log record's message and arguments (attached to every
    ``streambatch.*`` logger by ``logger``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = scrub(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(a if isinstance(a, (int, float)) else scrub(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: (v if isinstance(v, (int, float)) else scrub(v)) for k, v in record.args.items()}
        if record.exc_info and record.exc_info[1] is not None:
            scrub_exception(record.exc_info[1])
        return True


_FILTER = ScrubFilter()


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the scrub filter attached (once).

    A filter on a logger sees only the records logged through that logger
    itself, so each module's logger gets it, not just the ``streambatch`` parent."""
    log = logging.getLogger(name)
    if not any(isinstance(f, ScrubFilter) for f in log.filters):
        log.addFilter(_FILTER)
    return log
