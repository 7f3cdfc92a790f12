"""Plays the plan on the running release: the film's shots applied as batch GpuJobs with kubectl (the
bridge executes them: each carries its request), and image calls through the bridge's Service with the
real `openai` client, each at its time. Shows the live view until every job has ended."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import openai
import yaml
from kubernetes import client, config

from gpulane.api.resources import GROUP, VERSION

from .plan import FILM_MEMBER, FILM_MODEL, IMAGE_MODEL, Call, Plan
from .release import LANE, NAMESPACE, Tools
from .view import LiveView

Body = dict[str, Any]
TERMINAL = ("Succeeded", "Failed", "Cancelled")


@dataclass
class Answer:
    call: Call
    job: str | None = None
    capped: str | None = None  # the bridge's X-Gpulane-Priority-Capped
    error: str | None = None
    seconds: float = 0.0


def film_job(name: str, priority: str, tier: str, what: str) -> Body:
    """One of alice's GpuJobs: it names its request, so the bridge executes it and it ends."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": FILM_MODEL,
            "priority": priority,
            "tier": tier,
            "member": FILM_MEMBER,
            "maxRunSeconds": 600,
            "request": {
                "path": "/v1/chat/completions",
                "body": {"model": FILM_MODEL, "messages": [{"role": "user", "content": what}]},
            },
        },
    }


def film(shots: int) -> str:
    """The film as one manifest, applied at once."""
    return yaml.safe_dump_all(
        [film_job(f"shot-{i:02d}", "batch", "max", f"render shot {i}") for i in range(1, shots + 1)]
    )


class Player:
    def __init__(self, tools: Tools, plan: Plan, bridge_url: str, view: LiveView) -> None:
        self.tools, self.plan, self.bridge_url, self.view = tools, plan, bridge_url, view
        api = config.new_client_from_config(config_file=str(tools.kubeconfig))
        self.objects = client.CustomObjectsApi(api)
        self.answers: list[Answer] = []

    def jobs(self) -> list[Body]:
        items: list[Body] = self.objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "gpujobs")["items"]
        return items

    def models(self) -> dict[str, Body]:
        listed = self.objects.list_cluster_custom_object(GROUP, VERSION, "gpumodels")["items"]
        return {m["metadata"]["name"]: m for m in listed}

    def lane(self) -> Body:
        lane: Body = self.objects.get_cluster_custom_object(GROUP, VERSION, "gpulanes", LANE)
        return lane

    def clear(self) -> None:
        """The last run's jobs go first, so every job in the namespace is this run's."""
        self.tools.run("kubectl", "delete", "gpujobs", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=120s")

    def _call(self, answer: Answer, start: float) -> None:
        time.sleep(max(0.0, start + answer.call.at - time.monotonic()))
        began = time.monotonic()
        key = answer.call.key
        api = openai.OpenAI(base_url=self.bridge_url, api_key=key.key, max_retries=0, timeout=300)
        try:
            raw = api.images.with_raw_response.generate(
                model=IMAGE_MODEL,
                prompt=f"{key.member}'s picture",
                extra_headers={"X-LlamaSwap-Priority": answer.call.priority},
            )
            raw.parse()
            answer.job, answer.capped = raw.headers.get("X-Gpulane-Job"), raw.headers.get("X-Gpulane-Priority-Capped")
        except openai.OpenAIError as err:
            answer.error = f"{type(err).__name__}: {err}"
        answer.seconds = time.monotonic() - began

    def _preview(self, index: int, at: float, start: float) -> None:
        time.sleep(max(0.0, start + at - time.monotonic()))
        job = film_job(f"preview-{index:02d}", "interactive", "free", f"preview shot {index}")
        self.tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(job))

    def play(self, timeout: float = 900.0) -> list[Body]:
        """Everything submitted, then the view until every job ended; returns the jobs as they ended."""
        self.clear()
        self.answers = [Answer(c) for c in self.plan.calls]
        start = time.monotonic()
        self.tools.run("kubectl", "apply", "-f", "-", stdin=film(self.plan.shots))
        callers = [threading.Thread(target=self._call, args=(a, start), daemon=True) for a in self.answers]
        previews = [threading.Thread(target=self._preview, args=(i, at, start), daemon=True)
                    for i, at in enumerate(self.plan.previews, 1)]  # fmt: skip
        for thread in [*callers, *previews]:
            thread.start()
        expected = self.plan.shots + len(self.plan.previews) + len(self.plan.calls)
        while True:
            jobs, models = self.jobs(), self.models()
            ended = [j for j in jobs if (j.get("status") or {}).get("phase") in TERMINAL]
            answered = sum(1 for c in callers if not c.is_alive())
            shots = sum(1 for j in ended if j["metadata"]["name"].startswith("shot-"))
            progress = f"film {shots}/{self.plan.shots} shots, images {answered}/{len(callers)} answered"
            self.view.show(time.monotonic() - start, jobs, models, time.time(), progress)
            applied = not any(p.is_alive() for p in previews)
            if applied and answered == len(callers) and len(ended) == len(jobs) >= expected - self.failed_calls():
                return jobs
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the demo's jobs did not all end in {timeout:.0f}s ({progress})")
            time.sleep(0.5)

    def failed_calls(self) -> int:
        """Calls refused before their job was created make no job."""
        return sum(1 for a in self.answers if a.error is not None and a.job is None)
