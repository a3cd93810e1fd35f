"""The HTTP client side: one OpenAI-style request, streamed or not, read into a Completion."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from specparity.harness.profiles import ENDPOINTS, Profile, dig


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

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["raw"] = {k: v for k, v in self.raw.items() if k != "choices"}
        return d


def send(client: Any, base_url: str, req: Request, profile: Profile, extra: dict[str, Any] | None = None,
         timeout: float = 120.0) -> Completion:
    """POST ``req`` (plus ``extra`` fields) and read the answer; never raises for HTTP trouble."""
    import httpx

    body = dict(req.body)
    body.update(extra or {})
    if req.stream:
        body.setdefault("stream_options", {"include_usage": True})
    else:
        for k, v in profile.logprobs_request.items():
            body.setdefault(k, v)
    url = base_url + ENDPOINTS[req.endpoint]
    t0 = time.perf_counter()
    out = Completion()
    try:
        if req.stream:
            _read_stream(client, url, body, req, out, timeout)
        else:
            r = client.post(url, json=body, timeout=timeout)
            out.status = r.status_code
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {r.text[:300]}"
            else:
                _read_json(r.json(), req, profile, out)
    except httpx.TimeoutException:
        out.error = f"no answer within the request timeout of {timeout:g} s"
    except httpx.TransportError as err:
        out.error = f"connection failed: {type(err).__name__}: {err}"
    except (ValueError, KeyError, TypeError) as err:
        out.error = f"unreadable response: {type(err).__name__}: {err}"
    out.seconds = time.perf_counter() - t0
    out.sha256 = hashlib.sha256(out.text.encode("utf-8")).hexdigest()
    return out


def _choice_text(choice: dict[str, Any], endpoint: str, stream: bool) -> str:
    if endpoint == "chat":
        msg = choice.get("delta" if stream else "message") or {}
        return msg.get("content") or ""
    return choice.get("text") or ""


def _read_json(resp: dict[str, Any], req: Request, profile: Profile, out: Completion) -> None:
    choice = resp["choices"][0]
    out.raw = resp
    out.text = _choice_text(choice, req.endpoint, False)
    out.finish_reason = choice.get("finish_reason")
    out.usage = resp.get("usage") or {}
    content = dig(resp, profile.logprobs_path)
    if isinstance(content, list) and content:
        ids, lps, tops = [], [], []
        for entry in content:
            top = [(int(t["id"]), float(t["logprob"])) for t in entry.get("top_logprobs") or [] if "id" in t]
            if top:
                # mlx-lm lists the top-k unordered; at temperature 0 the emitted token is the best
                best = max(top, key=lambda t: t[1])
                ids.append(best[0])
                lps.append(best[1])
                tops.append(sorted(top, key=lambda t: -t[1]))
            elif "id" in entry:
                ids.append(int(entry["id"]))
                lps.append(float(entry["logprob"]))
        out.token_ids = ids or None
        # a server whose logprob values are placeholders (dflash-mlx: 0.0) keeps its ids only
        out.logprobs = (lps or None) if profile.logprobs_real else None
        out.top = (tops or None) if profile.logprobs_real else None


def _read_stream(client: Any, url: str, body: dict[str, Any], req: Request, out: Completion,
                 timeout: float) -> None:
    parts: list[str] = []
    with client.stream("POST", url, json=body, timeout=timeout) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.error = f"HTTP {r.status_code}: {r.read()[:300]!r}"
            return
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data.strip() == "[DONE]":
                break
            chunk = json.loads(data)
            out.raw = chunk
            if chunk.get("usage"):
                out.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                parts.append(_choice_text(choice, req.endpoint, True))
                if choice.get("finish_reason"):
                    out.finish_reason = choice["finish_reason"]
    out.text = "".join(parts)
