-- Mean reward of the training rollouts each weight version generated (a rollout's version: its first call's).
-- Held-out validation rollouts are left out: validation_per_version has them.
SELECT c.version AS weight_version, count() AS rollouts, round(avg(r.reward), 4) AS mean_reward,
       round(stddevPop(r.reward), 4) AS reward_std
FROM (SELECT rollout_id, min(weight_version) AS version FROM calls FINAL
      WHERE run_id = {run:String} GROUP BY rollout_id) AS c
INNER JOIN (SELECT rollout_id, reward FROM rollout_results FINAL
            WHERE run_id = {run:String} AND reward IS NOT NULL) AS r USING (rollout_id)
WHERE rollout_id NOT IN (SELECT rollout_id FROM rollouts FINAL WHERE run_id = {run:String} AND validation)
GROUP BY weight_version ORDER BY weight_version
