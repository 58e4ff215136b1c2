-- How rollouts ended, with an example reason for each status.
SELECT status, count() AS rollouts, anyIf(reason, reason IS NOT NULL) AS example_reason
FROM rollout_results FINAL WHERE run_id = {run:String}
GROUP BY status ORDER BY rollouts DESC
