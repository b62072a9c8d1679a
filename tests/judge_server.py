"""A small OpenAI-compatible chat-completions server for the judge tests.

It runs in a thread on 127.0.0.1 (a free port), records every request it receives, and
behaves as a test scripts it: answer well (a score chosen by `score_fn`), answer garbage,
answer slowly (so that client timeouts fire), fail with HTTP 500 a number of times and then
answer, or return log-probabilities. The real `openai` client talks to it over real HTTP.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# (system prompt, item dict with question/ground_truth/prediction) -> score label
ScoreFn = Callable[[str, dict[str, str]], str]


def default_score(system: str, item: dict[str, str]) -> str:
    """A deterministic grader: open items by word overlap on a 1-5 scale, closed items by
    whether the prediction starts with the ground truth (multilabel: 2 points / 0 points)."""
    pred = item["prediction"].lower().split()
    truth = item["ground_truth"].lower().split()
    if '"score": <1, 2, 3, 4 or 5>' in system:
        overlap = len(set(pred) & set(truth)) / max(len(set(truth)), 1)
        return str(1 + round(4 * overlap))
    hit = pred[: len(truth)] == truth
    if '"score": <0, 1 or 2>' in system:
        return "2" if hit else "0"
    return "1" if hit else "0"


def read_chat(body: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(rubric text, item) of a request, with or without a system message (a judge that had
    its system role rejected puts the rubric before the item in the user message)."""
    messages = body["messages"]
    user = next(m for m in messages if m["role"] == "user")["content"]
    if messages[0]["role"] == "system":
        return messages[0]["content"], json.loads(user)
    system, item = user.rsplit("\n\n", 1)
    return system, json.loads(item)


def completion(
    body: dict[str, Any], text: str, tokens: list[dict[str, Any]] | None, number: int
) -> dict[str, Any]:
    """A chat-completions reply to `body` answering `text`, with `tokens` as its
    `logprobs.content` (None: no log-probabilities)."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
        "logprobs": None if tokens is None else {"content": tokens},
    }
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class JudgeServer:
    """Scripted behaviour (set the attributes between runs):

    * `behaviour`: "good" | "garbage" | "slow";
    * `fail_first`: answer HTTP 500 to the next N requests, then behave;
    * `delay`: seconds a "slow" reply takes;
    * `label_probs`: when set and a request asks for logprobs, the score token's
      `top_logprobs` are these (plus a non-label token); `logprobs=False` never returns any;
    * `fail_when`: answer HTTP 500 to every request whose item it returns True for (a judge
      that cannot answer some items, however often it is asked).

    `authorizations` holds the Authorization header of every request (None: none sent), so
    tests can check which key reached the server.
    """

    def __init__(self, score_fn: ScoreFn = default_score) -> None:
        self.score_fn = score_fn
        self.behaviour = "good"
        self.fail_first = 0
        self.delay = 2.0
        self.logprobs = True
        self.label_probs: dict[str, float] | None = None
        self.reject_system = False  # answer HTTP 400 to chats with a system message
        self.reject_structured = False  # answer HTTP 400 to requests with a response_format
        self.honours_schema = False  # with a response_format, always reply valid JSON
        self.fail_when: Callable[[dict[str, str]], bool] | None = None
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def predictions(self) -> list[str]:
        """The predictions of every item the server was asked to judge."""
        with self._lock:
            bodies = list(self.requests)
        return [read_chat(body)[1]["prediction"] for body in bodies]

    def start(self) -> JudgeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- replies ------------------------------------------------------------------------------

    def _reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            fail = self.fail_first > 0
            if fail:
                self.fail_first -= 1
        if fail or (self.fail_when is not None and self.fail_when(read_chat(body)[1])):
            return 500, {"error": {"message": "scripted failure", "type": "server_error"}}
        if self.reject_system and any(m["role"] == "system" for m in body["messages"]):
            message = "Conversation roles must alternate user/assistant; System role not supported"
            return 400, {"error": {"message": message, "type": "invalid_request_error"}}
        schema = body.get("response_format")
        if self.reject_structured and schema:
            message = "response_format of type json_schema is not supported by this server"
            return 400, {"error": {"message": message, "type": "invalid_request_error"}}
        if self.behaviour == "slow":
            time.sleep(self.delay)
        system, item = read_chat(body)
        label = self.score_fn(system, item)
        if self.behaviour == "garbage" and not (schema and self.honours_schema):
            text = "As a language model I find this question fascinating."
        else:
            text = json.dumps({"score": int(label), "reason": "scripted"})
        tokens = None
        if body.get("logprobs") and self.logprobs and self.behaviour != "garbage":
            tokens = self._logprobs(label)
        return 200, completion(body, text, tokens, self.count)

    def _logprobs(self, label: str) -> list[dict[str, Any]]:
        """Tokens of `{"score": <label>, ...}` with `label_probs` at the score token."""
        probs = self.label_probs or {label: 1.0}
        top = [{"token": k, "logprob": math.log(v), "bytes": None} for k, v in probs.items()]
        top.append({"token": "x", "logprob": math.log(0.05), "bytes": None})

        def tok(text: str, tops: list[dict[str, Any]] | None = None) -> dict[str, Any]:
            return {"token": text, "logprob": 0.0, "bytes": None, "top_logprobs": tops or []}

        return [tok('{"'), tok("score"), tok('":'), tok(" "), tok(label, top), tok("}")]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.authorizations.append(self.headers.get("Authorization"))
                status, payload = server._reply(body)
                self._send(status, payload)

            def _send(self, status: int, payload: dict[str, Any] | bytes | None) -> None:
                if payload is None:  # the connection dropped without a reply
                    self.close_connection = True
                    return
                raw = isinstance(payload, bytes)  # a body that is not JSON
                data = payload if raw else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html" if raw else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def judge_overrides(server: JudgeServer, cache_dir: Any, *extra: str) -> list[str]:
    """Config overrides that score with the judge on `server` (generate mode, its own cache)."""
    return [
        "metric=[traditional,judge]",
        "judge.backend=openai",
        f"judge.base_url={server.base_url}",
        "judge.model=scripted",
        "judge.mode=generate",
        f"judge.cache_dir={cache_dir}",
        "judge.selfcheck=false",  # the scripted grader is not a judge; tests/test_selfcheck.py
        *extra,
    ]
