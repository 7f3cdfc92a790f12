"""ComfyUI's prompt protocol, as the fake backend answers it: a server that takes a render and answers at
once with a ticket (GpuModel ``spec.ticket``). The shapes follow ComfyUI's ``server.py`` and ``execution.py``:

- ``POST /prompt`` with ``{"prompt": {node_id: {"class_type": ..., "inputs": ...}}, "client_id": ...}`` answers
  ``{"prompt_id", "number", "node_errors": {}}``, or 400 ``{"error", "node_errors"}`` without a prompt;
- ``GET /history/{prompt_id}`` answers ``{}`` until the prompt is done, then ``{prompt_id: {"prompt": [number,
  prompt_id, prompt, extra_data, outputs_to_execute], "outputs": {node_id: {"images": [{"filename",
  "subfolder", "type"}]}}, "status": {"status_str", "completed", "messages"}, "meta": {...}}}``;
- ``GET /view?filename=...&type=output`` answers the image.

Prompts render one at a time, ``render_seconds`` each, as ComfyUI's single worker does. An output node is one
whose ``class_type`` starts with ``Save``; a node of class ``GpulaneFakeError`` makes the render fail (its
status ``error``), so the suite can follow a failed render too.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

FAILING_NODE = "GpulaneFakeError"


@dataclass
class _Render:
    number: int
    prompt: dict[str, Any]
    extra: dict[str, Any]
    started: float
    done_at: float


class ComfyPrompts:
    def __init__(self, render_seconds: float, png: bytes) -> None:
        self.render_seconds = render_seconds
        self.png = png
        self.renders: dict[str, _Render] = {}
        self.number = 0
        self.free_at = 0.0  # when the worker is done with the renders queued so far

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/prompt", self.post_prompt),
            web.get("/history/{prompt_id}", self.history),
            web.get("/view", self.view),
        ]

    async def post_prompt(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except ValueError:
            return web.json_response({"error": "the body is not valid JSON", "node_errors": []}, status=400)
        prompt = payload.get("prompt") if isinstance(payload, dict) else None
        if not isinstance(prompt, dict) or not prompt:
            return web.json_response({"error": "no prompt", "node_errors": []}, status=400)
        if not any(_is_output(node) for node in prompt.values()):
            error = {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "", "extra_info": {}}
            return web.json_response({"error": error, "node_errors": []}, status=400)
        now = time.monotonic()
        start = max(now, self.free_at)
        self.free_at = start + self.render_seconds
        prompt_id = str(uuid.uuid4())
        extra = {"client_id": payload["client_id"]} if "client_id" in payload else {}
        self.renders[prompt_id] = _Render(self.number, prompt, extra, start, self.free_at)
        self.number += 1
        return web.json_response({"prompt_id": prompt_id, "number": self.renders[prompt_id].number, "node_errors": {}})

    async def history(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        render = self.renders.get(prompt_id)
        if render is None or time.monotonic() < render.done_at:
            return web.json_response({})
        outputs_to_execute = [k for k, node in render.prompt.items() if _is_output(node)]
        failed = any(_class(node) == FAILING_NODE for node in render.prompt.values())
        stamp = int(render.started * 1000)
        image = {"filename": f"ComfyUI_{render.number + 1:05d}_.png", "subfolder": "", "type": "output"}
        outputs = {} if failed else {node_id: {"images": [image]} for node_id in outputs_to_execute}
        messages: list[list[Any]] = [["execution_start", {"prompt_id": prompt_id, "timestamp": stamp}]]
        if failed:
            messages.append(["execution_error", {"prompt_id": prompt_id, "exception_message": "the fake node failed"}])
        else:
            messages.append(["execution_success", {"prompt_id": prompt_id, "timestamp": stamp}])
        entry = {
            "prompt": [render.number, prompt_id, render.prompt, render.extra, outputs_to_execute],
            "outputs": outputs,
            "status": {"status_str": "error" if failed else "success", "completed": not failed, "messages": messages},
            "meta": {k: {"node_id": k, "display_node": k, "parent_node": None, "real_node_id": k} for k in outputs},
        }
        return web.json_response({prompt_id: entry})

    async def view(self, request: web.Request) -> web.Response:
        filename = request.query.get("filename", "")
        if not filename or filename[0] == "/" or ".." in filename:
            return web.Response(status=400)
        return web.Response(body=self.png, content_type="image/png")


def _class(node: object) -> str:
    return str(node.get("class_type", "")) if isinstance(node, dict) else ""


def _is_output(node: object) -> bool:
    return _class(node).startswith("Save") or _class(node) == FAILING_NODE
