"""Structured log lines: one JSON object per record, carrying the correlation id when known,
and the OpenTelemetry trace id inside a trace (so a log search finds the refresh's trace)."""

import json
import logging

from controlplane.correlation import current_correlation_id
from controlplane.telemetry import current_trace_id


class StructuredFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        correlation_id = current_correlation_id()
        if correlation_id:
            entry["correlation_id"] = correlation_id
        trace_id = current_trace_id()
        if trace_id:
            entry["trace_id"] = trace_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
