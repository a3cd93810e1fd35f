"""The HTTP client side: one OpenAI-style request, streamed or not, read into a Completion.

A request has a total deadline (harness.transport), not a per-read timeout; a response is data:
whatever a server sends that is not an OpenAI-style answer (no choices, a choice that is not an
object, text that is not a string, a chunk that is not JSON) is that request's ``error``, saying
what was wrong (:func:`read_json`, :func:`read_events`), never an exception out of :func:`send`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from specparity.harness.profiles import ENDPOINTS, Profile, dig
from specparity.harness.transport import MAX_RESPONSE_BYTES, BadResponse, Late, lines, parse_json, read_body, within
from specparity.schema import kind


@dataclass
class Request:
    """One request of an arm's sequence.

    id: its name in the sequence (``p0``, ``p0-again``, ``chat-2``...), unique in the sequence.
    kind: what it exercises (fresh, repeat, shared-prefix, stream, multi-turn, long).
    endpoint: completions or chat.
    body: the JSON body, without the width (the arm adds it where per request).
    turn: 1 for the first turn of a chat whose answer the next request carries, 2 for that next turn.
    repeats: the id of an earlier request of the sequence with the same endpoint and body (its
      own cold answer), None when it is the first to send them.
    """

    id: str
    kind: str
    endpoint: str
    body: dict[str, Any]
    turn: int = 0
    repeats: str | None = None

    def fingerprint(self) -> str:
        """The endpoint and body as canonical JSON: equal for two requests that send the same bytes."""
        return json.dumps([self.endpoint, self.body], sort_keys=True, separators=(",", ":"))

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def prompt_text(self) -> str | None:
        p = self.body.get("prompt")
        return p if isinstance(p, str) else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Completion:
    """What a server returned for one request.

    text: the completion text (chat: the message content). sha256: of its UTF-8 bytes.
    token_ids: per emitted token, where the server returned them (None when it did not).
    logprobs: the emitted token's logprob per token; top: [[(id, logprob)...]] per token.
    usage: the response's usage object. finish_reason: as the server said.
    seconds: wall time of the request. status: HTTP status (0: no response).
    error: why there is no completion. raw: the response (non-streamed) or the last chunk.
    limit_seconds: the time limit it was sent under (harness.limits; None: not sent by the runner).
    """

    text: str = ""
    sha256: str = ""
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    seconds: float = 0.0
    status: int = 0
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    limit_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["raw"] = {k: v for k, v in self.raw.items() if k != "choices"}
        return d


def send(client: Any, base_url: str, req: Request, profile: Profile, extra: dict[str, Any] | None = None,
         timeout: float = 120.0) -> Completion:
    """POST ``req`` (plus ``extra`` fields) and read the answer; never raises for HTTP trouble.

    ``timeout`` is the request's total deadline (a server that streams keep-alive comments, or
    trickles bytes, is cut off at it), not a per-read timeout. Whatever comes back that is not an
    OpenAI-style answer is the completion's ``error``, saying what was wrong.
    """
    import httpx

    body = dict(req.body)
    body.update(extra or {})
    for k, v in profile.request_fields.items():
        body.setdefault(k, v)
    if req.stream:
        body.setdefault("stream_options", {"include_usage": True})
    else:
        for k, v in profile.logprobs_request.items():
            body.setdefault(k, v)
    url = base_url + ENDPOINTS[req.endpoint]
    t0 = time.perf_counter()
    try:
        out = within(timeout, lambda cancel: _exchange(client, url, body, req, profile, timeout, cancel))
    except (Late, httpx.TimeoutException):  # the deadline, or a read timeout (as long) a moment before it
        out = Completion(error=f"no complete answer within the request timeout of {timeout:g} s")
    except httpx.TransportError as err:
        out = Completion(error=f"connection failed: {type(err).__name__}: {err}")
    except httpx.HTTPError as err:  # a body that does not decode (content-encoding), ...
        out = Completion(error=f"unreadable response: {type(err).__name__}: {err}")
    out.seconds = time.perf_counter() - t0
    out.limit_seconds = timeout
    out.sha256 = hashlib.sha256(out.text.encode("utf-8")).hexdigest()
    return out


def _exchange(client: Any, url: str, body: dict[str, Any], req: Request, profile: Profile, timeout: float,
              cancel: threading.Event) -> Completion:
    out = Completion()
    with client.stream("POST", url, json=body, timeout=timeout) as r:
        out.status = r.status_code
        try:
            if r.status_code != 200:
                head = read_body(r, cancel, 300, cut=True)
                out.error = f"HTTP {r.status_code}: {head.decode('utf-8', 'replace')}"
            elif req.stream:
                read_events(lines(r, cancel), req, out)
            else:
                read_json(parse_json(read_body(r, cancel, MAX_RESPONSE_BYTES)), req, profile, out)
        except BadResponse as err:
            out.error = f"unreadable response: {err}"
    if out.error is not None:  # nothing half-read passes for an answer
        out.text, out.token_ids, out.logprobs, out.top = "", None, None, None
    return out


def _need(value: Any, types: type | tuple[type, ...], where: str, what: str) -> Any:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadResponse(f"{where} is {kind(value)}, not {what}")
    if not isinstance(value, types):
        raise BadResponse(f"{where} is {kind(value)}, not {what}")
    return value


def _opt_str(value: Any, where: str) -> str | None:
    return None if value is None else _need(value, str, where, "a string")


def _choice_text(choice: Any, endpoint: str, stream: bool, where: str) -> str:
    _need(choice, dict, where, "an object")
    if endpoint == "chat":
        key = "delta" if stream else "message"
        msg = choice.get(key)
        if msg is None:
            return ""
        _need(msg, dict, f"{where}.{key}", "an object")
        return _opt_str(msg.get("content"), f"{where}.{key}.content") or ""
    return _opt_str(choice.get("text"), f"{where}.text") or ""


def _token_id(value: Any, where: str) -> int:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return int(_need(value, int, where, "a token id"))


def _logprob(value: Any, where: str) -> float:
    return float(_need(value, (int, float), where, "a number"))


def read_json(resp: Any, req: Request, profile: Profile, out: Completion) -> None:
    """A non-streamed response into ``out``; a BadResponse says what is not as an OpenAI-style
    server sends it (no choices, a choice or a logprobs entry that is not an object, text that is
    not a string, ...)."""
    _need(resp, dict, "the response", "an object")
    choices = _need(resp.get("choices"), list, "choices", "a list")
    if not choices:
        raise BadResponse("choices is empty: no completion")
    out.text = _choice_text(choices[0], req.endpoint, False, "choices[0]")
    out.finish_reason = _opt_str(choices[0].get("finish_reason"), "choices[0].finish_reason")
    usage = resp.get("usage")
    out.usage = {} if usage is None else _need(usage, dict, "usage", "an object")
    out.raw = resp
    content = dig(resp, profile.logprobs_path)
    if not isinstance(content, list) or not content:
        return
    ids, lps, tops = [], [], []
    for i, entry in enumerate(content):
        at = f"{profile.logprobs_path}[{i}]"
        _need(entry, dict, at, "an object")
        raw_top = entry.get("top_logprobs")
        top = []
        for j, t in enumerate(_need(raw_top, list, f"{at}.top_logprobs", "a list") if raw_top is not None else []):
            _need(t, dict, f"{at}.top_logprobs[{j}]", "an object")
            if "id" in t:
                top.append((_token_id(t["id"], f"{at}.top_logprobs[{j}].id"),
                            _logprob(t.get("logprob"), f"{at}.top_logprobs[{j}].logprob")))
        if top:
            # mlx-lm lists the top-k unordered; at temperature 0 the emitted token is the best
            best = max(top, key=lambda t: t[1])
            ids.append(best[0])
            lps.append(best[1])
            tops.append(sorted(top, key=lambda t: -t[1]))
        elif "id" in entry:
            ids.append(_token_id(entry["id"], f"{at}.id"))
            lps.append(_logprob(entry.get("logprob"), f"{at}.logprob"))
    out.token_ids = ids or None
    # a server whose logprob values are placeholders (dflash-mlx: 0.0) keeps its ids only
    out.logprobs = (lps or None) if profile.logprobs_real else None
    out.top = (tops or None) if profile.logprobs_real else None


def read_events(lines: Iterable[str], req: Request, out: Completion) -> None:
    """A streamed response's server-sent events into ``out``, up to ``data: [DONE]``; a BadResponse
    names the chunk that is not as an OpenAI-style server sends it."""
    parts: list[str] = []
    n, chosen = 0, False
    for line in lines:
        if not line.startswith("data: "):
            continue  # comments (keep-alives), event names, blank separators
        data = line[len("data: "):]
        if data.strip() == "[DONE]":
            break
        n += 1
        where = f"stream chunk {n}"
        try:
            chunk = json.loads(data)
        except RecursionError:
            raise BadResponse(f"{where}: JSON nested too deeply") from None
        except ValueError as err:
            raise BadResponse(f"{where}: not JSON ({err}): {data[:80]!r}") from None
        _need(chunk, dict, where, "an object")
        usage = chunk.get("usage")
        if usage:
            out.usage = _need(usage, dict, f"{where} usage", "an object")
        choices = chunk.get("choices")
        for i, choice in enumerate(_need(choices, list, f"{where} choices", "a list") if choices is not None else []):
            at = f"{where} choices[{i}]"
            parts.append(_choice_text(choice, req.endpoint, True, at))
            finish = _opt_str(choice.get("finish_reason"), f"{at}.finish_reason")
            if finish:
                out.finish_reason = finish
            chosen = True
        out.raw = chunk
    if not n:
        raise BadResponse("no data events in the stream")
    if not chosen:
        raise BadResponse(f"none of the stream's {n} chunks held a choice: no completion")
    out.text = "".join(parts)
