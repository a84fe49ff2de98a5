"""Running it: metrics, traces, logs, health and the instance identity.

- ``http``: the aiohttp app (``/healthz``, ``/readyz``, ``/metrics``, the readiness gate);
- ``metrics``: Prometheus; ``telemetry``: OpenTelemetry traces; ``logs``: logging with secrets
  redacted everywhere (hooks included);
- ``instance``, ``instance_store``: the stable instance id and its heartbeat row.
"""
