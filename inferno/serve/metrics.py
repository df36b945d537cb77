"""Counters and histograms for `GET /metrics`, in Prometheus' text format (version 0.0.4).

Written by the scheduler's thread and the HTTP handlers, read by a scrape: one lock keeps a
scrape from seeing a histogram half updated.
"""

from __future__ import annotations

import bisect
import threading

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for le, n in zip([*map(repr, self.buckets), "+Inf"], self.counts):
            total += n
            out.append(f'{name}_bucket{{le="{le}"}} {total}')
        return out + [f"{name}_sum {self.sum}", f"{name}_count {total}"]


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}  # HTTP status -> count
        self.prompt_tokens = 0  # prefilled
        self.prompt_tokens_cached = 0  # taken from a slot's cache instead (prefix reuse)
        self.generated_tokens = 0
        self.drafted_tokens = self.accepted_tokens = 0  # speculative decoding's
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def count_request(self, status: int) -> None:
        with self.lock:
            self.requests[str(status)] = self.requests.get(str(status), 0) + 1

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        """The text a scrape gets; `gauges` are name -> (help, value), read at scrape time."""
        with self.lock:
            rows = [
                ("inferno_requests_total", "counter", "HTTP requests to the API, by status",
                 [f'inferno_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]),
                ("inferno_prompt_tokens_total", "counter", "prompt tokens prefilled",
                 [f"inferno_prompt_tokens_total {self.prompt_tokens}"]),
                ("inferno_prompt_tokens_cached_total", "counter",
                 "prompt tokens whose K/V came from a slot's cache (prefix reuse), not prefilled",
                 [f"inferno_prompt_tokens_cached_total {self.prompt_tokens_cached}"]),
                ("inferno_generation_tokens_total", "counter", "tokens generated",
                 [f"inferno_generation_tokens_total {self.generated_tokens}"]),
                ("inferno_draft_tokens_total", "counter", "tokens drafted by speculative decoding",
                 [f"inferno_draft_tokens_total {self.drafted_tokens}"]),
                ("inferno_draft_accepted_tokens_total", "counter", "drafted tokens the model confirmed",
                 [f"inferno_draft_accepted_tokens_total {self.accepted_tokens}"]),
                ("inferno_time_to_first_token_seconds", "histogram",
                 "request arrival to its first token", self.ttft.lines("inferno_time_to_first_token_seconds")),
                ("inferno_inter_token_latency_seconds", "histogram",
                 "time between a sequence's consecutive tokens", self.itl.lines("inferno_inter_token_latency_seconds")),
            ]
        rows += [(name, "gauge", help_, [f"{name} {value:g}"]) for name, (help_, value) in gauges.items()]
        out = []
        for name, kind, help_, lines in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *lines]
        return "\n".join(out) + "\n"
