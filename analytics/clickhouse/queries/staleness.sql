-- Staleness of task groups when they were ready: the newest published weight version then, minus the
-- oldest version that generated any of the group's tokens.
SELECT greatest(w.version - g.min_version, 0) AS staleness, count() AS task_groups  -- w.version: 0 before any publication
FROM (SELECT run_id, group_id, min_version, created_at FROM task_groups FINAL WHERE run_id = {run:String}) AS g
ASOF LEFT JOIN (SELECT run_id, version, published_at FROM weight_versions FINAL WHERE run_id = {run:String}) AS w
    ON g.run_id = w.run_id AND g.created_at >= w.published_at
GROUP BY staleness ORDER BY staleness
