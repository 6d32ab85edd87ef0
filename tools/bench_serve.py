"""Section 10 of tools/bench_decode.py (`--only serve`): the server's cost against decoding offline.

The same NQ prompts (as the runner builds them, with their shared prefix) are decoded by AdaFuse offline,
`Ensemble.decode_stream` in this process, and through `adafuse-serve` (serve/) in a process of its own on the
loopback, by 1, 8 and 32 concurrent clients of the official `openai` client: each client takes the next
prompt as soon as its last completion is back, until every prompt is done. For each number of clients:
wall seconds, completions per second, each completion's latency (p50, p95), whether every text is the
offline one, and the server's wall time over the offline decode at the batch size the clients keep in
flight (the server's batch size at most): the overhead of the HTTP layer, the engine's thread and
continuous batching, with the same decoding underneath (goal at 8 clients: <= 1.10).
Offline decodes run while the server is idle; the two alternate, `repeats` times, and each side is warmed up
first (the kernels' probes).
"""

import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path

from adafuse import Ensemble, Request
from tools.serve_process import serving

CLIENTS = (1, 8, 32)


def decode_offline(ens: Ensemble, requests: list[Request], batch_size: int) -> tuple[float, list[str]]:
    """(wall seconds, the texts) of `decode_stream` at `batch_size`."""
    started = time.perf_counter()
    done = dict(ens.decode_stream(enumerate(requests), batch_size=batch_size))
    return time.perf_counter() - started, [done[i].text for i in range(len(requests))]


def decode_served(url: str, requests: list[Request], clients: int) -> tuple[float, list[float], list[str]]:
    """(wall seconds, each completion's latency, the texts) with `clients` clients sharing the prompts."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(len(requests)):
        todo.put(i)
    texts: list = [None] * len(requests)
    latencies: list = [None] * len(requests)

    def client_loop() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            r = requests[i]
            sent = time.perf_counter()
            reply = client.completions.create(
                model="tiny", prompt=r.prompt, max_tokens=r.max_new_tokens, stop=list(r.stop)
            )
            latencies[i] = time.perf_counter() - sent
            texts[i] = reply.choices[0].text

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, latencies, texts


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def compare_serve(ens: Ensemble, requests: list[Request], batch_size: int, threads: int, repeats: int) -> dict:
    """Every figure of the section (module doc). For each number of clients, `repeats` pairs of runs, the
    offline decode and the server's, alternating which goes first, so that machine drift (other processes on
    a shared machine) hits both alike; the ratio is that of their summed seconds."""
    ens.decode(requests[0], max_new_tokens=1)  # warm-up: the kernels' probes
    served, offline_texts = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        args = ["--pair", "tiny", "--threads", str(threads), "--batch-size", str(batch_size)]
        args += ["--queue-limit", str(max(CLIENTS))]
        with serving(*args, log=Path(folder) / "server.log") as server:  # idle (a poll every 0.2 s) while offline runs
            decode_served(server.url, requests[:1], 1)  # warm-up
            for clients in CLIENTS:
                size = min(clients, batch_size)
                seconds = {"server": [], "offline": []}
                latencies, identical = [], []
                for repeat in range(repeats):
                    for side in ("offline", "server") if repeat % 2 == 0 else ("server", "offline"):
                        if side == "offline":
                            took, offline_texts[size] = decode_offline(ens, requests, size)
                        else:
                            took, waits, texts = decode_served(server.url, requests, clients)
                            latencies += waits
                        seconds[side].append(took)
                    identical.append(sum(a == b for a, b in zip(texts, offline_texts[size])))
                served[str(clients)] = {
                    "seconds": seconds["server"],
                    "offline_seconds": seconds["offline"],
                    "offline_batch_size": size,
                    "completions_per_second": len(requests) * repeats / sum(seconds["server"]),
                    "latency_p50": statistics.median(latencies),
                    "latency_p95": percentile(latencies, 0.95),
                    "over_offline": sum(seconds["server"]) / sum(seconds["offline"]),
                    "identical_texts": min(identical),  # in the worst repeat
                }
                print(
                    f"  {clients:2d} clients: server {sum(seconds['server']):.1f}s, offline at batch {size} "
                    f"{sum(seconds['offline']):.1f}s: {served[str(clients)]['over_offline']:.2f}x; identical "
                    f"{min(identical)}/{len(requests)}",
                    flush=True,
                )
            passes = server.metrics()
    return {
        "prompts": len(requests),
        "budget": requests[0].max_new_tokens,
        "batch_size": batch_size,
        "repeats": repeats,
        "offline_identical_across_batch_sizes": len({tuple(t) for t in offline_texts.values()}) == 1,
        "served": served,
        "server_merged_passes": {k: v for k, v in passes.items() if k.startswith("adafuse_merged_passes_total")},
    }
