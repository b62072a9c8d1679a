"""An OpenAI-compatible chat-completions server for the `model=served` tests, on 127.0.0.1.

It answers with `answer_fn(body)` -> (text, per-token log-probabilities): `model_answerer`
wraps a model loaded in this process (the tiny LLaVA), answering as a vLLM server would: the
chat's image (a data URL) and text through the model's own processor and chat template, greedy
decoding (medvqa's own decoder) for the request's `max_tokens`. Everything else is the judge
tests' server (`tests.judge_server.JudgeServer`): the recorded requests and Authorization
headers, HTTP 500 for the first `fail_first` requests, `behaviour` "slow" (stalls `delay`
seconds), "garbage" (a 200 whose body is not JSON), "drop" (the connection closed without a
reply), and `logprobs = False` (a server that returns none).
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.judge_server import JudgeServer, completion

# body of a request -> (answer text, log-probabilities of its tokens)
AnswerFn = Callable[[dict[str, Any]], tuple[str, list[float]]]


def scripted(text: str = "yes") -> AnswerFn:
    """The same answer to every chat."""
    return lambda body: (text, [-0.25])


def read_chat(body: dict[str, Any]) -> tuple[str | None, str, Any]:
    """(system text, the user's text, its image as a PIL image or None) of a request."""
    from PIL import Image

    def texts(content: Any) -> str:
        if isinstance(content, str):
            return content
        return "".join(p["text"] for p in content if p["type"] == "text")

    system = next((texts(m["content"]) for m in body["messages"] if m["role"] == "system"), None)
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    image = None
    for part in user:
        if part["type"] == "image_url":
            data = part["image_url"]["url"].split(",", 1)[1]
            image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    return system, texts(user), image


def model_answerer(model: Any, processor: Any) -> AnswerFn:
    """Answers from `model` (in eval mode) as a server applying its chat template would, one
    chat at a time, with medvqa's greedy decoder; the log-probabilities of the answer tokens up
    to the first end token, as generation records them."""
    import torch

    from medvqa.generation.decode import Decoder
    from medvqa.generation.logprobs import ChosenLogProbs, end_token_ids
    from medvqa.generation.settings import GenerationSettings
    from medvqa.models.prompting import encode

    lock = threading.Lock()  # one generation at a time on the one model
    ends = end_token_ids(model, processor.tokenizer)
    pad = processor.tokenizer.pad_token_id

    def answer(body: dict[str, Any]) -> tuple[str, list[float]]:
        system, question, image = read_chat(body)
        features = encode(processor, question, image, system=system)
        batch = {k: (v[None] if v.dim() == 1 else v) for k, v in features.items()}
        settings = GenerationSettings(
            1, int(body["max_tokens"]), False, None, False, "static", False
        )
        recorder = ChosenLogProbs()
        with lock, torch.no_grad():
            out = Decoder(settings, pad)(model, batch, recorder)
        new = out[0, batch["input_ids"].shape[1] :]
        one = recorder.temperatures.index(1.0)
        logprobs = []
        for step, token in zip(recorder.steps, new.tolist(), strict=False):
            logprobs.append(float(step[0, one]))
            if token in ends:
                break
        return processor.decode(new, skip_special_tokens=True).strip(), logprobs

    return answer


class ServedServer(JudgeServer):
    """The judge tests' server, answering chats with `answer_fn` (module doc)."""

    def __init__(self, answer_fn: AnswerFn) -> None:
        super().__init__()
        self.answer_fn = answer_fn

    def _reply(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(body)
            fail = self.fail_first > 0
            if fail:
                self.fail_first -= 1
        if fail:
            return 500, {"error": {"message": "scripted failure", "type": "server_error"}}
        if self.behaviour == "slow":
            time.sleep(self.delay)
        elif self.behaviour == "drop":
            return 0, None
        elif self.behaviour == "garbage":
            return 200, b"<html>502 Bad Gateway</html>"
        text, logprobs = self.answer_fn(body)
        tokens = None
        if body.get("logprobs") and self.logprobs:
            tokens = [
                {"token": f"t{i}", "logprob": v, "bytes": None, "top_logprobs": []}
                for i, v in enumerate(logprobs)
            ]
        return 200, completion(body, text, tokens, self.count)
