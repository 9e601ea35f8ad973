"""Users Locust spawns in one batch start spread over the batch's interval, not in one instant."""

import random
from types import SimpleNamespace

import pytest
from locust.env import Environment

import loadgen.chat as chat
from loadgen.options import config_from_options
from loadgen.runtime import spawn_interval
from tests.loadgen.test_prompts_profiles import options


def environment(rate, dispatcher_rate=None) -> SimpleNamespace:
    dispatcher = SimpleNamespace(_spawn_rate=dispatcher_rate) if dispatcher_rate else None
    return SimpleNamespace(runner=SimpleNamespace(_users_dispatcher=dispatcher),
                           parsed_options=SimpleNamespace(spawn_rate=rate))


@pytest.mark.parametrize("rate, interval", [
    (200, 1.0),  # 200 users at once, once: spread over a second
    (2.5, 0.8),  # 2 users every 0.8 s
    (10, 1.0),
    (1.5, 0.0),  # one user at a time: nothing to spread
    (0.5, 0.0),
    (None, 0.0),
])
def test_interval_is_locusts_batch_interval(rate, interval):
    assert spawn_interval(environment(rate)) == pytest.approx(interval)


def test_the_runners_current_rate_wins_over_the_command_line():
    assert spawn_interval(environment(200, dispatcher_rate=4)) == pytest.approx(1.0)
    assert spawn_interval(environment(1, dispatcher_rate=2.5)) == pytest.approx(0.8)


@pytest.mark.parametrize("profile, flag, spreads", [
    ("steady", False, True),
    ("spike", False, True),
    ("steady", True, False),  # --no-spawn-jitter: Locust's herd, as it was
    ("poisson", False, False),  # open loop: arrivals come from the schedule
])
def test_on_start_waits_a_random_part_of_the_interval(monkeypatch, profile, flag, spreads):
    cfg = config_from_options(options(profile=profile, no_spawn_jitter=flag))
    assert cfg.spawn_jitter is not flag
    monkeypatch.setattr(chat, "STATE", SimpleNamespace(config=cfg, rng=random.Random(3)))
    slept = []
    monkeypatch.setattr(chat.gevent, "sleep", slept.append)
    class User(chat.ChatUser):
        host = "http://127.0.0.1:9"

    env = Environment(user_classes=[User])
    env.parsed_options = SimpleNamespace(spawn_rate=50)
    env.runner = SimpleNamespace(_users_dispatcher=None)
    delays = []
    for _ in range(20):
        user = User(env)
        user.on_start()
        assert user.client.trust_env is False  # the environment was read once (settle_environment)
        delays += slept
        slept.clear()
    if spreads:
        assert len(delays) == 20 and all(0 <= d <= 1.0 for d in delays) and len(set(delays)) == 20
    else:
        assert delays == []
