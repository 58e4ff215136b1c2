-- Held-out validation: the mean reward of each weight version validated, per sampling setting (never trained on).
SELECT version, setting, temperature, rollouts, round(mean_reward, 4) AS mean_reward, unrewarded,
       round(duration_s, 2) AS duration_s
FROM validation_scores FINAL WHERE run_id = {run:String} ORDER BY version, setting
