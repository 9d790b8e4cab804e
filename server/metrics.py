"""The hub's counters, rendered in the Prometheus text format for `GET /metrics`."""

from __future__ import annotations

import bisect
from collections import Counter

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Plain counters and gauges; the hub updates them, `render` prints them."""

    def __init__(self) -> None:
        self.connections = 0
        self.http_connections = 0  # keep-alive HTTP connections (`server.front`)
        self.channels = 0  # sessions over shared sockets (`server.mux`), one socket each above
        self.conversations_loaded = 0
        self.records_appended = 0
        self.pushes_accepted = 0
        self.pushes_placed = 0  # of the accepted: stale pushes the hub placed (SPEC 2.4.6)
        self.pushes_rejected: Counter[str] = Counter()
        self.send_queue_drops = 0
        self.protocol_errors: Counter[str] = Counter()
        # Live drafts and presence (SPEC 7): in memory only.
        self.drafts_open = 0
        self.draft_deltas_relayed = 0
        self.draft_bytes_relayed = 0
        self.presence = 0
        self.watchers = 0  # sockets watching without presence (SPEC 17)
        self.kit_streams: dict[str, int] = {}  # open kit streams by protocol (SPEC 13)
        self._latency_counts = [0] * (len(_LATENCY_BUCKETS) + 1)
        self._latency_sum = 0.0
        self._latency_count = 0

    def observe_append(self, seconds: float) -> None:
        """Count one durable append that took `seconds`."""
        self._latency_counts[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        self._latency_sum += seconds
        self._latency_count += 1

    def render(self) -> str:
        lines = [
            "# HELP convsync_connections Open websocket connections.",
            "# TYPE convsync_connections gauge",
            f"convsync_connections {self.connections}",
            "# HELP convsync_channels Replica sessions over shared websockets (/v1/mux).",
            "# TYPE convsync_channels gauge",
            f"convsync_channels {self.channels}",
            "# HELP convsync_http_connections Open plain HTTP connections.",
            "# TYPE convsync_http_connections gauge",
            f"convsync_http_connections {self.http_connections}",
            "# HELP convsync_conversations_loaded Conversations held in memory.",
            "# TYPE convsync_conversations_loaded gauge",
            f"convsync_conversations_loaded {self.conversations_loaded}",
            "# HELP convsync_records_appended_total Records appended to logs.",
            "# TYPE convsync_records_appended_total counter",
            f"convsync_records_appended_total {self.records_appended}",
            "# HELP convsync_pushes_accepted_total Pushes appended and acked.",
            "# TYPE convsync_pushes_accepted_total counter",
            f"convsync_pushes_accepted_total {self.pushes_accepted}",
            "# HELP convsync_pushes_placed_total Accepted pushes made on an older revision, "
            "placed by the hub.",
            "# TYPE convsync_pushes_placed_total counter",
            f"convsync_pushes_placed_total {self.pushes_placed}",
            "# HELP convsync_pushes_rejected_total Pushes rejected, by reason.",
            "# TYPE convsync_pushes_rejected_total counter",
        ]
        for reason in sorted({"behind", "lineage", "invalid", *self.pushes_rejected}):
            lines.append(
                f'convsync_pushes_rejected_total{{reason="{reason}"}} '
                f"{self.pushes_rejected[reason]}"
            )
        lines += [
            "# HELP convsync_protocol_errors_total Connections closed for bad input, by code.",
            "# TYPE convsync_protocol_errors_total counter",
        ]
        lines += [
            f'convsync_protocol_errors_total{{code="{code}"}} {count}'
            for code, count in sorted(self.protocol_errors.items())
        ]
        lines += [
            "# HELP convsync_send_queue_drops_total Subscribers dropped for lagging.",
            "# TYPE convsync_send_queue_drops_total counter",
            f"convsync_send_queue_drops_total {self.send_queue_drops}",
            "# HELP convsync_drafts_open Drafts open (messages being streamed).",
            "# TYPE convsync_drafts_open gauge",
            f"convsync_drafts_open {self.drafts_open}",
            "# HELP convsync_draft_deltas_relayed_total Draft delta messages sent to replicas.",
            "# TYPE convsync_draft_deltas_relayed_total counter",
            f"convsync_draft_deltas_relayed_total {self.draft_deltas_relayed}",
            "# HELP convsync_draft_bytes_relayed_total Bytes of draft deltas sent to replicas.",
            "# TYPE convsync_draft_bytes_relayed_total counter",
            f"convsync_draft_bytes_relayed_total {self.draft_bytes_relayed}",
            "# HELP convsync_presence Connections listed in presence.",
            "# TYPE convsync_presence gauge",
            f"convsync_presence {self.presence}",
            "# HELP convsync_watchers Joined connections watching without presence.",
            "# TYPE convsync_watchers gauge",
            f"convsync_watchers {self.watchers}",
            "# HELP convsync_kit_streams Open chat-kit streams (AI SDK, AG-UI), by protocol.",
            "# TYPE convsync_kit_streams gauge",
        ]
        lines += [
            f'convsync_kit_streams{{protocol="{name}"}} {count}'
            for name, count in sorted({"aisdk": 0, "agui": 0, **self.kit_streams}.items())
        ]
        lines += [
            "# HELP convsync_append_seconds Time from a push's arrival to its durable append.",
            "# TYPE convsync_append_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip(_LATENCY_BUCKETS, self._latency_counts, strict=False):
            cumulative += count
            lines.append(f'convsync_append_seconds_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'convsync_append_seconds_bucket{{le="+Inf"}} {self._latency_count}')
        lines.append(f"convsync_append_seconds_sum {self._latency_sum:.6f}")
        lines.append(f"convsync_append_seconds_count {self._latency_count}")
        return "\n".join(lines) + "\n"
