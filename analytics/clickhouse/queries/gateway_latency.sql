-- Latency of calls through the gateway (received to answered) and in the engine, per API.
SELECT api, count() AS calls,
       round(quantile(0.5)(latency_ms), 2) AS p50_ms, round(quantile(0.9)(latency_ms), 2) AS p90_ms,
       round(quantile(0.99)(latency_ms), 2) AS p99_ms, round(quantile(0.5)(engine_ms), 2) AS engine_p50_ms,
       round(quantile(0.5)(queued_ms), 2) AS held_p50_ms
FROM calls FINAL WHERE run_id = {run:String} GROUP BY api ORDER BY calls DESC
