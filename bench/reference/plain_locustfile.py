"""The plain reference client for bench/loadgen_fidelity.py: HttpUser, post(stream=True), iter_lines(),
json.loads of each data line; a token is a chunk with non-empty content (llmserve, vLLM and OpenAI
send a role-only first chunk, `"content": ""`, before the first token).

Times each content line as iter_lines hands it over and, on quit, writes one JSON object per
request to $LOADGEN_REFERENCE_OUT.<pid> (one file per process, so `--processes N` runs write N + 1):
{"start_unix", "ttft_s", "e2e_s", "itl_s", "num_tokens", "id"} (`id`: the server's completion id, to join
with its own log).
"""

import json
import os
import time

from locust import HttpUser, events, task

RESULTS: list[dict] = []
BODY = {"model": os.environ.get("LOADGEN_REFERENCE_MODEL", "sched-model"),
        "max_tokens": int(os.environ.get("LOADGEN_REFERENCE_TOKENS", "32")), "stream": True, "ignore_eos": True,
        "messages": [{"role": "user", "content": "tell me a story"}]}


class ReferenceUser(HttpUser):
    @task
    def stream(self):
        start_unix, start = time.time(), time.perf_counter()
        arrivals, completion_id = [], None
        with self.client.post("/v1/chat/completions", json=BODY, stream=True, catch_response=True) as resp:
            for line in resp.iter_lines():
                if line.startswith(b"data: {"):  # a token: non-empty content (not the role-only first chunk)
                    event = json.loads(line[6:])
                    completion_id = completion_id or event.get("id")
                    choices = event.get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        arrivals.append(time.perf_counter() - start)
        if arrivals:
            RESULTS.append({"start_unix": start_unix, "ttft_s": arrivals[0], "e2e_s": arrivals[-1], "itl_s": [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)],
                            "num_tokens": len(arrivals), "id": completion_id})


@events.quitting.add_listener
def _write(environment, **kwargs):
    path = f"{os.environ['LOADGEN_REFERENCE_OUT']}.{os.getpid()}"
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in RESULTS)
    os.replace(path + ".tmp", path)  # whole or not there: the bench waits for every process's file
