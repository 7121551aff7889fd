"""The engine's lean SimPy environment and process (mksim.sim._env) run events in SimPy's own order."""

from __future__ import annotations

import doctest
import random

import simpy
from simpy.core import URGENT

from mksim.sim import _env
from mksim.sim._env import Env, Proc


def _story(env: simpy.Environment, start, seed: int) -> list[tuple[float, str]]:
    """Processes that wait on timeouts (many at the same instants), on events others trigger, and on
    events of each priority; every wake-up is logged with the clock."""
    rnd = random.Random(seed)
    log: list[tuple[float, str]] = []
    shared = [env.event() for _ in range(5)]

    def worker(name: str):
        for step in range(30):
            pick = rnd.random()
            if pick < 0.5:
                yield env.timeout(rnd.choice([0, 0.5, 1.0, 1.5]))
            elif pick < 0.7:
                ev = shared[rnd.randrange(len(shared))]
                if not ev.triggered:
                    ev.succeed(name)
                yield env.timeout(0.25)
            elif pick < 0.85:
                ev = shared[rnd.randrange(len(shared))]
                yield ev  # processed already (or not yet triggered: another worker may trigger it)
            else:
                ev = env.event()
                ev._ok, ev._value = True, None
                env.schedule(ev, rnd.choice([URGENT, 1, 2]), rnd.choice([0, 0.5]))
                yield ev
            log.append((env.now, f"{name}.{step}"))

    def trigger_all():
        yield env.timeout(20.0)
        for ev in shared:
            if not ev.triggered:
                ev.succeed("late")

    for k in range(8):
        start(env, worker(f"w{k}"))
    start(env, trigger_all())
    env.run()
    return log


def test_env_and_proc_run_a_story_in_simpys_order():
    for seed in range(20):
        want = _story(simpy.Environment(), simpy.events.Process, seed)
        assert _story(Env(), Proc, seed) == want
        assert _story(Env(), simpy.events.Process, seed) == want  # the engine's env, simpy's process
        assert len(want) > 100


def test_env_steps_and_runs_until_as_simpy_does():
    env = Env()
    env.timeout(3.0)
    env.step()
    assert env.now == 3.0 == env._now
    env.timeout(2.0)
    env.run(until=4.0)
    assert env.now == 4.0
    env.run()
    assert env.now == 5.0


def test_doctests():
    assert doctest.testmod(_env).failed == 0
