"""Prometheus metrics of one server instance, in its own registry (several apps may live in one process).

The spec-decode counters follow vLLM's (`vllm:spec_decode_num_drafts_total`, ...) under this server's prefix:
a draft is one verification pass of one sequence that proposed at least one token; its draft tokens are its depth
(K for a chain, the longest path for a tree); accepted tokens are the draft tokens the target kept, and
`..._per_pos_total{position="i"}` counts drafts whose token at depth i + 1 was kept (position 0 is the first).
So accepted / draft tokens is the token-weighted acceptance rate and 1 + accepted / drafts the mean acceptance
length (the bonus token included), over any scrape interval.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from specdecode.drafters.common.suffix_store import StoreStats

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdecode_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.finished = Counter("specdecode_generations", "Generations that left the batch, by finish reason",
                                ["reason"], registry=r)
        self.prompt_tokens = Counter("specdecode_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.cached_prompt_tokens = Counter("specdecode_prompt_tokens_cached",
                                            "Prompt tokens whose KV a finished request's row still held (not "
                                            "prefilled again)", registry=r)
        self.generated_tokens = Counter("specdecode_generated_tokens", "Tokens generated (committed)", registry=r)
        self.target_passes = Counter("specdecode_target_passes",
                                     "Batched target verification passes (one per scheduler step)", registry=r)
        self.sequence_passes = Counter("specdecode_sequence_passes",
                                       "Sequence-rows verified (a step over b rows adds b)", registry=r)
        self.drafts = Counter("specdecode_spec_decode_num_drafts", "Sequence-passes that verified a non-empty draft",
                              registry=r)
        self.draft_tokens = Counter("specdecode_spec_decode_num_draft_tokens", "Draft tokens proposed (draft depth)",
                                    registry=r)
        self.accepted_tokens = Counter("specdecode_spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                       registry=r)
        self.accepted_per_pos = Counter("specdecode_spec_decode_num_accepted_tokens_per_pos",
                                        "Drafts whose token at this position (0 = first) was accepted", ["position"],
                                        registry=r)
        self.acceptance = Histogram("specdecode_acceptance_rate",
                                    "Per-generation draft acceptance rate (generations that drafted something)",
                                    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r)
        self.tau = Histogram("specdecode_tau", "Per-generation tokens per target pass",
                             buckets=(1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0), registry=r)
        self.ttft = Histogram("specdecode_time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram("specdecode_time_per_output_token_seconds",
                              "Mean time per generated token after the first, per generation", buckets=_LATENCY,
                              registry=r)
        self.step_seconds = Histogram("specdecode_step_seconds", "One scheduler step (draft + verify + commit)",
                                      buckets=_LATENCY, registry=r)
        self.batch_size = Histogram("specdecode_batch_size", "Rows per step", buckets=(1, 2, 4, 8, 16, 32, 64),
                                    registry=r)
        self.k_cap = Gauge("specdecode_speculation_k_cap", "Draft length cap chosen for the last step", registry=r)
        self.speculation_off = Counter("specdecode_speculation_off_steps",
                                       "Steps whose draft length cap was 0: the cost table found no draft worth its "
                                       "verify rows at this batch size", registry=r)
        self.free_only = Counter("specdecode_speculation_free_only_steps",
                                 "Steps that allowed free drafts only (no draft pass): a model's drafts did not pay "
                                 "at this batch size, free ones (suffix, hybrid's free part) did", registry=r)
        self.row_cost = Gauge("specdecode_row_cost",
                              "One more verify row, in one-token passes, as the drafters plan with it now (CPU; "
                              "NaN until first measured)", registry=r)
        self.queue_depth = Gauge("specdecode_queue_depth", "Requests waiting for a batch row", registry=r)
        self.active = Gauge("specdecode_active_sequences", "Sequences in the batch", registry=r)

    def watch_row_cost(self, current: Callable[[], float | None]) -> None:
        """Read the target's row cost estimate at scrape time (never measuring: pass_costs.RowCostEstimate.peek)."""
        self.row_cost.set_function(lambda: float("nan") if (value := current()) is None else value)

    def watch(self, queued: Callable[[], int], active: Callable[[], int]) -> None:
        """Read the queue depth and batch size live at scrape time."""
        self.queue_depth.set_function(queued)
        self.active.set_function(active)

    def watch_stores(self, stores: Mapping[str, Callable[[], StoreStats]]) -> None:
        """Export the suffix stores of the served drafters (drafter name -> its store's `stats`: `suffix`, a
        `hybrid`'s free drafter), read at scrape time, each sample labelled with its drafter."""
        if stores:
            self.registry.register(_StoreCollector(dict(stores)))

    def count_rejected(self, status: int) -> None:
        """A request answered below the app (connections.py: a head too slow, too large or malformed, no
        connection free), counted under the endpoint "connection"."""
        self.requests.labels("connection", str(status)).inc()

    def observe_draft(self, drafted: int, accepted: int) -> None:
        """One sequence's verification pass: a draft of depth `drafted`, of which `accepted` tokens were kept."""
        if drafted <= 0:
            return
        self.drafts.inc()
        self.draft_tokens.inc(drafted)
        self.accepted_tokens.inc(accepted)
        for position in range(accepted):
            self.accepted_per_pos.labels(str(position)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCollector(Collector):
    """The suffix stores' size and use, from one `stats()` call per store and scrape (the scheduler thread updates
    the counts; each is read whole), labelled by drafter."""

    def __init__(self, stores: dict[str, Callable[[], StoreStats]]):
        self.stores = stores

    def collect(self) -> Iterator[Metric]:
        families = [
            (GaugeMetricFamily, "specdecode_suffix_store_tokens", "Tokens held by the suffix store", "tokens"),
            (GaugeMetricFamily, "specdecode_suffix_store_sequences", "Sequences held by the suffix store",
             "sequences"),
            (GaugeMetricFamily, "specdecode_suffix_store_capacity_tokens", "The suffix store's cap (--suffix-store)",
             "capacity"),
            (CounterMetricFamily, "specdecode_suffix_store_evicted_sequences",
             "Sequences evicted from the suffix store (oldest first)", "evicted"),
            (CounterMetricFamily, "specdecode_suffix_drafts", "Non-empty drafts proposed by the suffix drafter",
             "drafts"),
            (CounterMetricFamily, "specdecode_suffix_store_hits",
             "Suffix drafts drawn from the store (earlier requests), not only the request itself", "hits"),
        ]
        stats = {name: read() for name, read in self.stores.items()}
        for kind, metric, help_text, field_name in families:
            family = kind(metric, help_text, labels=["drafter"])
            for name, s in stats.items():
                family.add_metric([name], getattr(s, field_name))
            yield family
