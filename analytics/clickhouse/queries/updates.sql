-- The trainer's updates: what each trained on, its loss, and the reward of the groups it used.
SELECT version, task_groups, tokens, round(mean_reward, 4) AS mean_reward, round(loss, 5) AS loss,
       round(entropy, 3) AS entropy, round(kl, 5) AS kl, round(staleness_mean, 2) AS staleness_mean,
       dropped_stale, dropped_no_signal, round(seconds, 2) AS seconds
FROM updates FINAL WHERE run_id = {run:String} ORDER BY version
