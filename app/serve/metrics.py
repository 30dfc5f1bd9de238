"""``GET /metrics``: the server's counters in Prometheus' text format.

A registry per :class:`~loomlab.app.serve.server.Server` (not prometheus_client's global one), so
two servers in one process, or one per test module, count apart. The engine's own figures
(active and queued sequences, prefix cache hits) are read from ``engine.stats()`` at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Summary, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, engine_stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("loomlab_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("loomlab_prompt_tokens", "Prompt tokens of generation requests",
                                     registry=r)
        self.generated_tokens = Counter("loomlab_generated_tokens", "Tokens generated", registry=r)
        self.time_to_first_token = Summary("loomlab_time_to_first_token_seconds",
                                           "From a request's arrival to its first token", registry=r)
        self.tokens_per_second = Summary("loomlab_decode_tokens_per_second",
                                         "Decode speed of each finished sequence", registry=r)
        r.register(_EngineCollector(engine_stats))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """The engine's live figures, read when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict]):
        self.stats = stats

    def collect(self):
        s = self.stats()
        yield GaugeMetricFamily("loomlab_active_sequences", "Sequences being decoded", value=s["active"])
        yield GaugeMetricFamily("loomlab_queued_sequences", "Sequences waiting for a batch slot",
                                value=s["queued"])
        yield CounterMetricFamily("loomlab_prefix_cache_hits", "Prompts that reused cached KV",
                                  value=s["prefix_hits"])
        yield CounterMetricFamily("loomlab_prefix_cache_hit_tokens",
                                  "Prompt tokens served by the prefix cache", value=s["prefix_hit_tokens"])
        yield GaugeMetricFamily("loomlab_prefix_cache_bytes", "Bytes held by the prefix cache",
                                value=s["prefix_cache_bytes"])
