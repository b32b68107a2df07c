"""A small load generator for `POST /slack/events`, meant to run in its own process.

    python -m tests.bench.load --url http://127.0.0.1:PORT --requests FILE --concurrency 50
    python -m tests.bench.load --url http://127.0.0.1:PORT --count 2000 --secret S --prefix ack

Either it reads pre-built requests (a JSON-lines FILE of {"body", "headers", "content_type"}) or it
builds and signs `count` `app_mention` events itself, each with its own event_id, channel and ts.
Everything is built before the clock starts. `concurrency` threads then each hold one keep-alive
`http.client` connection and take requests from a shared list until it is empty.

It prints one JSON object: {"latencies": [seconds, ...] in send order, "statuses": {"200": n},
"elapsed": seconds from first send to last answer, "errors": [...]}.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.signing import event_body, signed_headers

Request = tuple[str, dict[str, str], str]  # body, headers (incl. signature), content type


def mention_requests(secret: str, count: int, prefix: str, *, ts_base: int = 1_700_100_000) -> list[Request]:
    """`count` signed app_mention callbacks, each in its own channel and thread."""
    out: list[Request] = []
    for i in range(count):
        ts = f"{ts_base + i}.{i % 1_000_000:06d}"
        event = {
            "type": "app_mention",
            "user": "UALICE",
            "text": f"<@UBOT> {prefix} load {i}: say hi",
            "ts": ts,
            "channel": f"C{prefix.upper()}{i:05d}",
        }
        body = event_body(event, event_id=f"Ev{prefix}{i:06d}")
        out.append((body, signed_headers(secret, body), "application/json"))
    return out


def read_requests(lines: Iterable[str]) -> list[Request]:
    out: list[Request] = []
    for line in lines:
        if line.strip():
            item = json.loads(line)
            out.append((item["body"], item["headers"], item.get("content_type", "application/json")))
    return out


def write_requests(path: str, requests: Iterable[Request]) -> None:
    with open(path, "w") as handle:
        for body, headers, content_type in requests:
            handle.write(json.dumps({"body": body, "headers": headers, "content_type": content_type}) + "\n")


def send_all(
    url: str, requests: list[Request], concurrency: int, *, rate: float = 0.0, timeout: float = 30.0
) -> dict[str, Any]:
    """Send `requests` over `concurrency` keep-alive connections; latencies in send order.

    Without `rate` each connection sends its next request as soon as it has the last answer (a
    closed loop: the server is kept saturated). With `rate` request i is due at start + i / rate (an
    open loop, like Slack's traffic) and its latency counts from when it was due, so a request that
    waited for a free connection, or for its connection to open, is charged for the wait.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path.rstrip("/") or "") + "/slack/events"
    latencies: list[float | None] = [None] * len(requests)
    statuses: Counter[int] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    next_index = iter(range(len(requests)))
    start = threading.Barrier(concurrency + 1)
    began_at = [0.0]

    def connect() -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.connect()
        return conn

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        if not rate:  # saturating: every connection ready before the clock starts
            try:
                conn = connect()
            except OSError as exc:
                with lock:
                    errors.append(f"connect: {exc!r}")
        # In the open loop a connection is opened with its first request, as Slack does: one opened
        # early and left silent holds a gunicorn gthread thread (it reads the request it was
        # accepted for) while requests on other connections wait, which no client of ours does.
        start.wait()
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                break
            body, headers, content_type = requests[i]
            data = body.encode()
            due = began_at[0] + i / rate if rate else None
            if due is not None and (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            for attempt in range(2):  # one reconnect if the server closed an idle keep-alive
                try:
                    if conn is None:
                        conn = connect()
                    began = time.perf_counter()
                    conn.request("POST", path, body=data, headers={**headers, "Content-Type": content_type})
                    response = conn.getresponse()
                    response.read()
                    took = time.perf_counter() - (began if due is None else min(began, due))
                    with lock:
                        latencies[i] = took
                        statuses[response.status] += 1
                    if response.getheader("connection", "").lower() == "close":
                        conn.close()
                        conn = None
                    break
                except (OSError, http.client.HTTPException) as exc:
                    if conn is not None:
                        conn.close()
                    conn = None
                    if attempt == 1:
                        with lock:
                            errors.append(f"request {i}: {exc!r}")
                            statuses[0] += 1
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    cpu = time.process_time()
    began_at[0] = time.perf_counter() + (0.05 if rate else 0.0)  # all past the barrier before one is due
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began_at[0]
    return {
        "latencies": [x for x in latencies if x is not None],
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "elapsed": elapsed,
        "errors": errors[:20],
        "cpu": time.process_time() - cpu,  # this process's own CPU while sending
    }


def cpu_seconds(pids: Iterable[int], *, children: bool = False) -> float:
    """User + system CPU time so far of the live processes `pids` (Linux /proc), in seconds.

    With `children`, also the CPU of their children that exited and were waited for (RQ's work horses).
    """
    import os

    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        if children:
            total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / tick


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.load")
    parser.add_argument("--url", required=True, help="the bot's base URL, e.g. http://127.0.0.1:3000")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--requests", help="JSON-lines file of pre-built requests ('-' for stdin)")
    parser.add_argument("--count", type=int, default=0, help="build this many signed mentions instead")
    parser.add_argument("--secret", default="", help="signing secret for --count")
    parser.add_argument("--prefix", default="load", help="channel/event-id prefix for --count")
    parser.add_argument("--rate", type=float, default=0.0, help="requests per second (open loop)")
    args = parser.parse_args(argv)
    if args.requests:
        if args.requests == "-":
            requests = read_requests(sys.stdin)
        else:
            with open(args.requests) as handle:
                requests = read_requests(handle)
    else:
        requests = mention_requests(args.secret, args.count, args.prefix)
    result = send_all(args.url, requests, args.concurrency, rate=args.rate)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
