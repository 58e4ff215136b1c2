"""A harness whose behaviour its task dictates (for controller tests): sleep, post a reward, print, exit.

Task fields: sleep (s), exit (code), reward (posted to TETHER_REWARD_URL), print (last stdout line),
ignore_term (keep running on SIGTERM), child (start a grandchild that must die with the group).
Each run appends its rollout id, pid, API key and seed to $TEST_LEDGER, so a test can see whether a rollout ran
twice and what it was given.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

task = json.loads(os.environ["TETHER_TASK"])
with open(os.environ["TEST_LEDGER"], "a") as ledger:
    ledger.write(f"{os.environ['TETHER_ROLLOUT_ID']} {os.getpid()} {os.environ.get('OPENAI_API_KEY', '-')} "
                 f"{os.environ.get('TETHER_SEED', '-')}\n")
if task.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if task.get("child"):
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(os.environ["TEST_LEDGER"] + ".children", "a") as f:
        f.write(f"{grandchild.pid}\n")
time.sleep(float(task.get("sleep", 0)))
if "reward" in task:
    request = urllib.request.Request(
        os.environ["TETHER_REWARD_URL"], data=json.dumps({"reward": task["reward"]}).encode(),
        headers={"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "content-type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()
if "print" in task:
    print(task["print"])
sys.exit(int(task.get("exit", 0)))
