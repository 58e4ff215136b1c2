-- Generated and prompt tokens per rollout, summed over its calls.
SELECT quantileExact(0.5)(completion) AS completion_p50, quantileExact(0.9)(completion) AS completion_p90,
       max(completion) AS completion_max, round(avg(completion), 1) AS completion_mean,
       round(avg(prompt), 1) AS prompt_mean, count() AS rollouts
FROM (SELECT rollout_id, sum(completion_tokens) AS completion, sum(prompt_tokens) AS prompt
      FROM calls FINAL WHERE run_id = {run:String} GROUP BY rollout_id)
