"""`tether view` in a real browser: a recorded run on the topics, the page's process reading them, and headless
Chromium (Debian's chromium and chromium-driver, driven by selenium) opening every view. Each view must show its
elements with no error in the browser's console; a screenshot of each is written (to TETHER_VIEW_SCREENSHOTS when
set: that is how docs/view/ is made)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from analytics.view.app import TOPICS, project
from analytics.view.store import Positions, ViewStore
from infra.processes import free_port, stop
from schemas import events as ev
from schemas.events import run_of
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild
from tests.conftest import spawn
from tests.factories import T0, as_recorded

CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists()
                                                else None)
SYSTEM = "You answer with a tool call. Tools: `look(letter)` shows a card, `submit(letter)` ends the task."


def chat_call(rng: random.Random, *, run_id: str, rid: str, seq: int, messages: list[dict[str, object]],
              version: int, final: bool) -> tuple[ev.ModelCall, dict[str, Any]]:
    """One chat call as the gateway records it, and the assistant message the harness appends."""
    letter = rng.choice("ABCD")
    name = "submit" if final else "look"
    tool_call = {"id": f"call_{rid[-6:]}_{seq}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps({"letter": letter})}}
    text = f"I will {name} {letter}."
    message = {"role": "assistant", "content": text, "tool_calls": [tool_call]}
    response = {"id": f"chatcmpl-{seq}", "object": "chat.completion", "model": "tiny",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    request = {"model": "tiny", "messages": messages, "max_tokens": 40,
               "tools": [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("look", "submit")]}
    tokens = [rng.randrange(3, 1000) for _ in range(rng.randint(8, 16))]
    received = T0 + timedelta(seconds=seq * 2)
    call = ev.ModelCall(
        call_id=f"{rid}-c{seq}", rollout_id=rid, run_id=run_id, gateway_id="gw-0", seq=seq, api="openai.chat",
        model="tiny", request_json=json.dumps(request), response_json=json.dumps(response),
        prompt_token_ids=[rng.randrange(3, 1000) for _ in range(20 + 30 * seq)], response_token_ids=tokens,
        response_logprobs=[-rng.expovariate(1.5) for _ in tokens], weight_version=version,
        sampling=ev.Sampling(temperature=1.0, top_p=1.0, max_tokens=40, seed=None),
        usage=ev.Usage(prompt_tokens=20 + 30 * seq, completion_tokens=len(tokens)),
        timings=ev.Timings(received_at=received, finished_at=received + timedelta(milliseconds=rng.randint(40, 90)),
                           queued_ms=rng.random() * 5, engine_ms=rng.uniform(30, 60)),
        finish_reason="tool_calls")
    return call, message


def rollout(rng: random.Random, run_id: str, gid: str, task: str, k: int, version: int,
            reward: float | None, validation: bool = False, temperature: float | None = None,
            group_size: int = 3) -> list[ev.Event]:
    rid = f"{gid}.r{k}.a0"
    out: list[ev.Event] = [ev.RolloutStarted(rollout_id=rid, run_id=run_id, group_id=gid, task_id=task,
                                             task_json=json.dumps({"id": task}), group_size=group_size,
                                             weight_version=version, validation=validation,
                                             temperature=temperature, started_at=T0)]
    messages: list[dict[str, object]] = [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": f"Task {task}: find the letter A."}]
    calls = []
    for seq in range(rng.randint(2, 3)):
        final = seq == 2 or (seq == 1 and rng.random() < 0.5)
        call, answer = chat_call(rng, run_id=run_id, rid=rid, seq=seq, messages=list(messages), version=version,
                                 final=final)
        calls.append(call.call_id)
        out.append(call)
        tool_id = answer["tool_calls"][0]["id"]
        messages += [answer, {"role": "tool", "tool_call_id": tool_id, "content": f"card {seq}: {rng.choice('ABCD')}"}]
        if final:
            break
    out.append(ev.RolloutSealed(rollout_id=rid, run_id=run_id, call_ids=calls, sealed_at=T0))
    out.append(ev.RolloutFinished(rollout_id=rid, run_id=run_id, status="succeeded" if reward is not None else
                                  "failed", exit_code=0 if reward is not None else 1, reward=reward,
                                  reason=None if reward is not None else "the harness exited with code 1",
                                  duration_s=4.0 + k, finished_at=T0 + timedelta(seconds=10)))
    return out


#: the held-out rewards of each validated version's rollouts, per sampling setting (and its pinned temperature)
VALIDATION: dict[int, dict[tuple[str, float | None], list[float]]] = {
    0: {("greedy", 0.0): [0.0, 0.5], ("harness", None): [0.0, 0.0]},
    2: {("greedy", 0.0): [1.0, 0.5], ("harness", None): [0.5, 0.0]},
}
HELD_OUT = sum(len(rewards) for rounds in VALIDATION.values() for rewards in rounds.values())


def validation_round(rng: random.Random, run_id: str, version: int) -> list[ev.Event]:
    """One round of held-out validation as the controller records it: a group of rollouts per sampling setting
    (all scored 0 where nothing trains on them), then the report of their mean rewards."""
    settings = VALIDATION[version]
    out: list[ev.Event] = [ev.ValidationStarted(run_id=run_id, version=version,
                                                rollouts=sum(map(len, settings.values())), started_at=T0)]
    scores = []
    for (setting, temperature), rewards in settings.items():
        gid = f"{run_id}.held-out-v{version}-{setting}/0"
        for k, reward in enumerate(rewards):
            out += rollout(rng, run_id, gid, "held-out-0", k, version, reward, validation=True,
                           temperature=temperature, group_size=len(rewards))
        scores.append(ev.ValidationScore(setting=setting, rollouts=len(rewards), temperature=temperature,
                                         mean_reward=sum(rewards) / len(rewards), duration_s=5.0))
    out.append(ev.ValidationReported(run_id=run_id, version=version, scores=scores, seconds=6.0, reported_at=T0))
    return out


def recorded_run(run_id: str, seed: int = 0, validation: bool = False) -> list[ev.Event]:
    """Four task groups of three rollouts over two weight versions, with two updates, as the services record
    them (calls as their differences); with `validation`, held-out rounds before training and after it."""
    rng = random.Random(seed)
    out: list[ev.Event] = []
    for g in range(4):
        version = g // 2
        rewards: list[float | None] = [1.0, 0.0, 1.0] if g % 2 == 0 else [0.0, 1.0, None]
        for k, reward in enumerate(rewards):
            out += rollout(rng, run_id, f"{run_id}.letters-{g}/0", f"letters-{g}", k, version, reward)
    for version in VALIDATION if validation else ():
        out += validation_round(rng, run_id, version)
    out = as_recorded(out)
    out += rebuild(out, run_id, Policy())
    given = {1: [ev.RolloutAdvantage(group_id=f"{run_id}.letters-0/0", rollout_id=f"{run_id}.letters-0/0.r{k}.a0",
                                     advantage=a, calls=[ev.CallAdvantage(seq=s, advantage=c) for s, c in calls])
                 for k, (a, calls) in enumerate([(0.577, [(0, 0.3), (1, 0.577)]), (-1.155, [(0, -0.9), (1, -1.155)]),
                                                 (0.577, [])])]}  # as with credit per call; letters-1 not trained
    for version in (1, 2):
        out.append(ev.TrainerStep(run_id=run_id, version=version, task_groups=2, tokens=300 * version,
                                  mean_reward=0.4 + 0.2 * version, loss=0.05 / version, entropy=2.0, clip_fraction=0.1,
                                  kl=0.01, grad_norm=1.0, staleness_mean=0.5, staleness_max=1.0, dropped_stale=0,
                                  dropped_no_signal=0, seconds=3.0, advantages=given.get(version, [])))
        out.append(ev.WeightVersionPublished(run_id=run_id, version=version, checkpoint_path=f"/ckpt/v{version}",
                                             final=version == 2))
    return out


async def publish(bus: BusSettings, events: list[ev.Event]) -> None:
    async with EventProducer(bus) as producer:
        await producer.publish_many(events)


@dataclass(frozen=True)
class View:
    url: str
    run_id: str
    bus: BusSettings


@pytest.fixture(scope="module")
def view(bus: BusSettings, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[View]:
    run_id = f"view-{uuid.uuid4().hex[:8]}"
    asyncio.run(publish(bus, recorded_run(run_id, validation=True)))
    folder = tmp_path_factory.mktemp("view")
    port = free_port()
    url, process = spawn(["tether.cli", "view", "--run", run_id, "--dsn", f"chdb://{folder / 'store'}", "--model",
                          str(tiny_model), "--port", str(port)], folder / "view.log", "tether view", port,
                         {"TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers})
    try:
        deadline = time.monotonic() + 60
        while not httpx.get(f"{url}/health").json()["caught_up"]:
            assert time.monotonic() < deadline, (folder / "view.log").read_text()
            time.sleep(0.2)
        yield View(url, run_id, bus)
    finally:
        stop(process)


def test_rollouts_filter_and_bad_filters_get_a_clear_error(view: View) -> None:
    rollouts = f"{view.url}/api/runs/{view.run_id}/rollouts"
    every = httpx.get(rollouts).json()
    assert len(every) == 12 + HELD_OUT and {r["status"] for r in every} == {"succeeded", "failed"}
    assert sum(r["validation"] for r in every) == HELD_OUT
    assert len(httpx.get(rollouts, params={"validation": "false"}).json()) == 12
    assert len(httpx.get(rollouts, params={"status": "failed"}).json()) == 2
    assert {r["task_id"] for r in httpx.get(rollouts, params={"task": "letters-1"}).json()} == {"letters-1"}
    assert {r["version"] for r in httpx.get(rollouts, params={"version": "1"}).json()} == {1}
    assert all(r["reward"] >= 0.5 for r in httpx.get(rollouts, params={"reward_min": "0.5"}).json())
    assert len(httpx.get(rollouts, params={"version": "", "task": ""}).json()) == 12 + HELD_OUT  # a blank field
    bad = httpx.get(rollouts, params={"version": "latest"})
    assert bad.status_code == 422 and "version" in bad.text
    assert httpx.get(f"{view.url}/runs/{view.run_id}/rollouts/no-such-rollout").status_code == 404


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if CHROMEDRIVER is None or not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()):
        pytest.skip("Chromium is not installed: `sudo apt-get install chromium chromium-driver` (make setup "
                    "installs them when it runs as root)")
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TETHER_VIEW_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def visit(driver: WebDriver, url: str, view_name: str, shot: Path) -> list[dict[str, object]]:
    """Open `url`, check it is the view asked for, screenshot it; returns the console's messages."""
    driver.get(url)
    main = driver.find_element(By.ID, "view")
    assert main.get_attribute("data-view") == view_name
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    logs: list[dict[str, object]] = driver.get_log("browser")
    assert not [entry for entry in logs if entry["level"] == "SEVERE"], logs
    return logs


def test_every_view_in_headless_chromium(view: View, browser: WebDriver, tmp_path: Path) -> None:
    def find(css: str) -> list[WebElement]:
        return browser.find_elements(By.CSS_SELECTOR, css)

    shots = screenshots(tmp_path)
    run = view.run_id
    visit(browser, f"{view.url}/", "runs", shots / "runs.png")
    assert [a.text for a in find("#runs td.id a")] == [run]

    visit(browser, f"{view.url}/runs/{run}", "run", shots / "run.png")
    charts = {f.get_attribute("data-chart"): f for f in find("figure.chart")}
    assert len(charts) == 6
    assert len(charts["mean reward by update"].find_elements(By.CSS_SELECTOR, "circle")) == 2
    band = charts["reward by sampling weight version (± spread)"]
    assert band.find_elements(By.CSS_SELECTOR, "polygon")  # the spread
    settings = sorted({setting for rounds in VALIDATION.values() for setting, _ in rounds})
    assert [s.text for s in band.find_elements(By.CSS_SELECTOR, ".legend span")] == [
        "training", *(f"validation: {s}" for s in settings)]
    assert len(band.find_elements(By.CSS_SELECTOR, "polyline[stroke-dasharray]")) == len(settings)
    assert len(find("#validation tbody tr")) == sum(map(len, VALIDATION.values()))
    assert [c.text for c in find("#latency td:first-child")] == ["openai.chat"]

    visit(browser, f"{view.url}/runs/{run}/rollouts?status=failed", "rollouts", shots / "rollouts.png")
    rows = find("#rollouts tbody tr")
    assert len(rows) == 2 and all("failed" in r.text for r in rows)
    Select(browser.find_element(By.NAME, "status")).select_by_value("")
    browser.find_element(By.CSS_SELECTOR, "#filters button").click()
    WebDriverWait(browser, 10).until(lambda _: len(find("#rollouts tbody tr")) == 12 + HELD_OUT)
    Select(browser.find_element(By.NAME, "validation")).select_by_value("true")
    browser.find_element(By.CSS_SELECTOR, "#filters button").click()
    WebDriverWait(browser, 10).until(lambda _: len(find("#rollouts tbody tr")) == HELD_OUT)
    assert all(r.find_elements(By.CSS_SELECTOR, ".badge") for r in find("#rollouts tbody tr.validation"))
    assert len(find("#rollouts tbody tr.validation")) == HELD_OUT

    group = f"{run}.letters-0/0"
    visit(browser, f"{view.url}/runs/{run}/groups/{quote(group)}", "group", shots / "group.png")
    members = find("#members article")
    assert len(members) == 3
    rewards = [m.find_element(By.CSS_SELECTOR, ".reward").text for m in members]
    advantages = [m.find_element(By.CSS_SELECTOR, ".advantage").text for m in members]
    assert rewards == ["1", "0", "1"] and advantages == ["+0.577", "-1.155", "+0.577"]  # as update 1 gave them
    assert "update 1" in browser.find_element(By.ID, "given").text
    assert members[0].find_element(By.CSS_SELECTOR, ".call-advantages").text == "#0 +0.300 · #1 +0.577"
    assert not members[2].find_elements(By.CSS_SELECTOR, ".call-advantages")
    assert all(m.find_element(By.CSS_SELECTOR, "pre.answer").text.startswith("I will")
               for m in members)

    rollout_id = f"{group}.r1.a0"
    visit(browser, f"{view.url}/runs/{run}/rollouts/{quote(rollout_id)}", "trajectory", shots / "trajectory.png")
    calls = find("#calls li.call")
    assert len(calls) >= 2
    last = calls[-1]
    whole = 20 + 30 * (len(calls) - 1)  # the call's whole prompt, though it was recorded as what it adds
    assert f"{whole} prompt tokens" in last.find_element(By.CSS_SELECTOR, ".call-head").text
    roles = [r.text for r in last.find_elements(By.CSS_SELECTOR, ".message .role")]
    assert roles[:3] == ["SYSTEM", "USER", "ASSISTANT"] and "TOOL" in roles  # the messages as the harness sent them
    assert last.find_elements(By.CSS_SELECTOR, "pre.tool-call")
    tokens = last.find_elements(By.CSS_SELECTOR, ".tokens .tok")
    assert tokens and all("logprob" in (t.get_attribute("title") or "") for t in tokens)
    assert not any(t.text.startswith("#") for t in tokens)  # decoded by the model's tokenizer, not ids
    colours = {t.value_of_css_property("background-color") for t in tokens}
    assert len(colours) > 1  # coloured by logprob

    visit(browser, f"{view.url}/diverge?a={run}&b={run}", "diverge", shots / "diverge.png")  # a run against itself
    paired = 12 + HELD_OUT
    assert f"{paired}/{paired}" in browser.find_element(By.ID, "summary").text and not find("section.divergence")


def test_a_refresh_shows_rollouts_that_arrived_since(view: View, browser: WebDriver) -> None:
    url = f"{view.url}/runs/{view.run_id}/rollouts"
    browser.get(url)
    before = len(browser.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr"))
    gid = f"{view.run_id}.letters-late/0"
    asyncio.run(publish(view.bus, rollout(random.Random(7), view.run_id, gid, "letters-late", 0, 2, 1.0)))
    deadline = time.monotonic() + 30
    while True:
        browser.refresh()
        rows = browser.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")
        if len(rows) > before or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(rows) == before + 1 and any("letters-late" in r.text for r in rows)



def test_without_kafka_the_page_still_answers_and_says_it_has_not_caught_up(tmp_path: Path) -> None:
    """Kafka down (or not yet up): the page serves what its store holds, and keeps trying the topics."""
    port = free_port()
    url, process = spawn(["tether.cli", "view", "--dsn", f"chdb://{tmp_path / 'store'}", "--port", str(port)],
                         tmp_path / "view.log", "tether view", port,
                         {"TETHER_BUS_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"})
    try:
        time.sleep(2.0)
        assert httpx.get(f"{url}/health").json() == {"caught_up": False}
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and "No run on the topics yet" in page.text
        assert process.poll() is None
    finally:
        stop(process)


def test_each_view_has_a_json_twin(view: View) -> None:
    api = f"{view.url}/api/runs/{view.run_id}"
    curves = httpx.get(f"{api}/curves").json()
    assert [x for x, _ in curves["reward_by_update"]] == [1, 2] and curves["latency"][0]["api"] == "openai.chat"
    assert {s: [v for v, _ in points] for s, points in curves["validation_by_version"].items()} == {
        "greedy": sorted(VALIDATION), "harness": sorted(VALIDATION)}
    group = httpx.get(f"{api}/groups/{quote(f'{view.run_id}.letters-1/0')}").json()
    assert [m["row"]["reward"] for m in group["members"]] == [0.0, 1.0, None]
    # not trained: estimated as verl's GRPO does (sample std); the failed one has no reward
    assert [m["advantage"] for m in group["members"]] == [pytest.approx(-0.7071, abs=1e-4),
                                                           pytest.approx(0.7071, abs=1e-4), None]
    assert group["trained_in"] is None and all(m["calls"] == {} for m in group["members"])
    given = httpx.get(f"{api}/groups/{quote(f'{view.run_id}.letters-0/0')}").json()
    assert given["trained_in"] == 1 and given["members"][1]["calls"] == {"0": -0.9, "1": -1.155}
    rollout = httpx.get(f"{api}/rollouts/{quote(f'{view.run_id}.letters-1/0.r1.a0')}").json()
    assert rollout["row"]["status"] == "succeeded" and rollout["calls"]
    first = rollout["calls"][0]
    assert first["messages"][0]["role"] == "system" and first["tool_calls"][0]["name"] in ("look", "submit")
    assert len(first["tokens"]) > 0 and all(t["logprob"] <= 0 for t in first["tokens"])
    assert httpx.get(f"{api}/groups/nothing-here").status_code == 404


class CountingStore(ViewStore):
    """The store, counting the events of one run that the projection hands it."""

    def __init__(self, dsn: str, run_id: str) -> None:
        super().__init__(dsn)
        self.run_id, self.handed = run_id, 0

    def add(self, events: Sequence[ev.Event], run_id: str | None, read_to: Positions | None = None) -> int:
        self.handed += sum(run_of(e) == self.run_id for e in events)
        return super().add(events, run_id, read_to)


def test_a_restarted_view_reads_on_from_where_its_store_left_off(bus: BusSettings, tmp_path: Path) -> None:
    run_id = f"resume-{uuid.uuid4().hex[:8]}"
    recorded = recorded_run(run_id, seed=3)
    asyncio.run(publish(bus, recorded))
    store = CountingStore(f"chdb://{tmp_path / 'store'}", run_id)
    asyncio.run(project(store, bus, run_id, follow=False, caught_up=asyncio.Event()))
    assert store.handed == len(recorded)
    rollouts = "SELECT count() AS n FROM rollouts FINAL WHERE run_id = {run:String}"
    assert store.rows(rollouts, run=run_id) == [{"n": 12}]

    late = rollout(random.Random(9), run_id, f"{run_id}.letters-late/0", "letters-late", 0, 2, 1.0)
    asyncio.run(publish(bus, late))
    store.handed = 0
    asyncio.run(project(store, bus, run_id, follow=False, caught_up=asyncio.Event()))  # a new reader: a restart
    assert store.handed == len(late)  # not the run again from the start
    assert store.rows(rollouts, run=run_id) == [{"n": 13}]
    assert store.positions(None) == {}  # a view of every run has its own place


def test_a_stored_place_past_a_topics_end_reads_the_topic_from_its_start(bus: BusSettings, tmp_path: Path) -> None:
    """As after the topics were made anew: what the store says it read is beyond their end."""
    run_id = f"anew-{uuid.uuid4().hex[:8]}"
    recorded = recorded_run(run_id, seed=4)
    asyncio.run(publish(bus, recorded))
    store = CountingStore(f"chdb://{tmp_path / 'store'}", run_id)
    beyond = {(topic.name, partition): 10**12 for topic in TOPICS for partition in range(topic.partitions)}
    store.add([], run_id, beyond)
    assert store.positions(run_id) == beyond
    asyncio.run(project(store, bus, run_id, follow=False, caught_up=asyncio.Event()))
    assert store.handed == len(recorded)
    assert all(offset < 10**12 for offset in store.positions(run_id).values())


def test_the_diverge_view_compares_two_runs_in_its_store_as_tether_diverge_does(tmp_path: Path) -> None:
    """Two runs recorded alike and a third that samples otherwise, in one store: the page and its JSON twin give
    the comparison `tether diverge` makes from the events themselves."""
    from fastapi import FastAPI
    from fastapi.staticfiles import StaticFiles
    from fastapi.testclient import TestClient

    from analytics.view.pages import router
    from analytics.view.reads import RunReads
    from repro.diverge import compare, rollouts
    from schemas.calls import whole

    runs = {"dv-a": recorded_run("dv-a", seed=3), "dv-b": recorded_run("dv-b", seed=3),
            "dv-c": recorded_run("dv-c", seed=4)}
    store = ViewStore(f"chdb://{tmp_path / 'store'}")
    store.add([e for events in runs.values() for e in events], None)
    app = FastAPI()
    app.mount("/static", StaticFiles(directory=Path(__file__).parent.parent / "analytics" / "view" / "static"),
              name="static")
    app.include_router(router(RunReads(store)))

    def expected(a: str, b: str) -> dict[str, Any]:
        keyed = {run: rollouts([*(e for e in runs[run] if not isinstance(e, ev.ModelCall)),
                                *whole(e for e in runs[run] if isinstance(e, ev.ModelCall))], run) for run in (a, b)}
        # the store keeps no prompt ids, so the page cannot say which calls were the same in tokens
        return compare(a, keyed[a], b, keyed[b]).to_json() | {"same_tokens_calls": None}

    with TestClient(app) as client:
        same = client.get("/api/diverge", params={"a": "dv-a", "b": "dv-b"}).json()
        assert same == expected("dv-a", "dv-b")
        assert same["pairs"] == same["identical_rollouts"] == 12 and same["identical_calls"] == same["calls"] > 12
        other = client.get("/api/diverge", params={"a": "dv-a", "b": "dv-c"}).json()
        assert other == expected("dv-a", "dv-c") and other["identical_rollouts"] < other["pairs"]
        page = client.get("/diverge", params={"a": "dv-a", "b": "dv-c"})
        assert page.status_code == 200 and 'id="summary"' in page.text and "the engine first" in page.text
        assert "dv-b" in client.get("/diverge").text  # the form lists the store's runs
        assert client.get("/api/diverge", params={"a": "dv-a"}).status_code == 422
