-- How many model calls rollouts made: the harness decides its own loop.
SELECT n_calls AS calls, count() AS rollouts
FROM (SELECT rollout_id, count() AS n_calls FROM calls FINAL WHERE run_id = {run:String} GROUP BY rollout_id)
GROUP BY calls ORDER BY calls
