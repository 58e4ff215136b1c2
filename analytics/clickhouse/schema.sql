-- Analytics tables the sink fills from the topics. ReplacingMergeTree on each
-- record's own id: a record written twice (a restarted sink re-reads a little)
-- counts once in queries that use FINAL.
CREATE TABLE IF NOT EXISTS calls (
    run_id String, rollout_id String, call_id String, seq UInt32, choice_index UInt32, api LowCardinality(String),
    model String, status LowCardinality(String), http_status UInt16, finish_reason Nullable(String),
    prompt_tokens UInt32, completion_tokens UInt32, weight_version Int64, engine_ms Float64, queued_ms Float64,
    latency_ms Float64, received_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, rollout_id, call_id);

CREATE TABLE IF NOT EXISTS rollouts (
    run_id String, rollout_id String, group_id String, task_id String, attempt UInt32,
    retry_of Nullable(String), runner LowCardinality(String), weight_version Int64,
    started_at DateTime64(6, 'UTC'), validation Bool DEFAULT false, temperature Nullable(Float64),
    seed Nullable(Int64)
) ENGINE = ReplacingMergeTree ORDER BY (run_id, rollout_id);

CREATE TABLE IF NOT EXISTS rollout_results (
    run_id String, rollout_id String, status LowCardinality(String), reward Nullable(Float64),
    exit_code Nullable(Int32), duration_s Float64, reason Nullable(String), finished_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, rollout_id);

CREATE TABLE IF NOT EXISTS task_groups (
    run_id String, group_id String, task_id String, group_size UInt32, rollouts UInt32, dropped UInt32,
    partial Bool, trainable_tokens UInt64, mean_reward Nullable(Float64), min_version Int64, max_version Int64,
    created_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, group_id);

CREATE TABLE IF NOT EXISTS weight_versions (
    run_id String, version Int64, checkpoint_path Nullable(String), published_at DateTime64(6, 'UTC'),
    final Bool DEFAULT false
) ENGINE = ReplacingMergeTree ORDER BY (run_id, version);

CREATE TABLE IF NOT EXISTS updates (
    run_id String, version Int64, task_groups UInt32, tokens UInt64, mean_reward Float64, loss Float64,
    entropy Float64, clip_fraction Float64, kl Float64, grad_norm Float64, staleness_mean Float64,
    staleness_max Float64, dropped_stale UInt32, dropped_no_signal UInt32, seconds Float64,
    stepped_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, version);

-- Held-out validation: one row per weight version validated and sampling setting (ValidationReported's scores).
CREATE TABLE IF NOT EXISTS validation_scores (
    run_id String, version Int64, setting String, temperature Nullable(Float64), rollouts UInt32,
    mean_reward Float64, unrewarded UInt32, duration_s Float64, reported_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, version, setting);

-- Columns added since the tables were first made: a table made before them gets them here (rows already there
-- read as the default). Each is a no-op on a table that has it.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS validation Bool DEFAULT false;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS temperature Nullable(Float64);
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS seed Nullable(Int64);
ALTER TABLE weight_versions ADD COLUMN IF NOT EXISTS final Bool DEFAULT false;
