"""Load management at cluster scale, by simulation: the policies are pure, so 1,000 agents and
10,000 tasks need no cluster (issue 32, docs/load.md).

Each task's load series is recorded from one of a few daily-shaped waves (phase, amplitude and
noise drawn from a seeded RNG). Tasks are placed first fit by mean load (today's placement), then
`scheduler.load_distribution.plan_moves` runs rounds of pairwise moves; the script prints the
time to decide one round and the simulated peak load of the busiest agent against first fit.
Then the scheduler's distributor (`scheduler.distributor.decide_distribution`: the
same pairing restricted to tasks that may move, by room, cool-downs and apart groups) on the
first-fit placement, as many rounds, with a random half of the tasks opted in and every agent's
free cpus and memory drawn at random: the slowest round's time and the peak after its moves.
Then the same tasks, overloaded, become a shedding problem (a source drop point, an operator on
the task's agent, a weighted sink each, plus a channel branch for every tenth task) and
`scheduler.shedding.plan_shedding` decides the drop ratios of all of them in one LP; the script
prints the time and the weighted loss against uniform random shedding. Medians of --repeats.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_util  # noqa: E402

bench_util.use_repo_on_path()

import numpy as np  # noqa: E402

from scheduler.distributor import (DistributionSettings, DistributionView,  # noqa: E402
                                   decide_distribution)
from scheduler.load_distribution import (DistributionPolicy, apply_moves, peak_load,  # noqa: E402
                                         plan_moves)
from scheduler.shedding import (DropPoint, Operator, ShedProblem, Sink, plan_shedding,  # noqa: E402
                                uniform_keep, uniform_ratio, weighted_loss)


def recorded_loads(tasks: int, length: int, rng: random.Random) -> dict[str, np.ndarray]:
    """Load series (CPU s/s) of `tasks` tasks, each following one of four phase-shifted waves."""
    steps = np.arange(length)
    loads = {}
    for i in range(tasks):
        phase = rng.choice((0.0, 0.5, 1.0, 1.5)) * math.pi
        amplitude = rng.uniform(0.02, 0.08)
        base = rng.uniform(0.03, 0.1)
        noise = np.array([rng.gauss(0.0, 0.005) for _ in range(length)])
        loads[f"t{i}"] = np.maximum(0.0, base + amplitude * np.sin(
            2 * math.pi * steps / length + phase) + noise)
    return loads


def first_fit(loads: dict[str, np.ndarray], agents: int, capacity: float
              ) -> dict[str, list[str]]:
    placed: dict[str, list[str]] = {f"a{i}": [] for i in range(agents)}
    used = dict.fromkeys(placed, 0.0)
    names = list(placed)
    for task, series in loads.items():
        need = float(series.mean())
        for agent in names:
            if used[agent] + need <= capacity:
                placed[agent].append(task)
                used[agent] += need
                break
        else:
            agent = min(names, key=used.__getitem__)
            placed[agent].append(task)
            used[agent] += need
    return placed


def shed_problem(placed: dict[str, list[str]], loads: dict[str, np.ndarray],
                 overload: float, rng: random.Random) -> ShedProblem:
    points, operators, sinks = [], [], []
    agent_of = {t: a for a, ts in placed.items() for t in ts}
    capacity = {a: 1.0 for a in placed}
    names = list(placed)
    for i, (task, series) in enumerate(loads.items()):
        rate = 100.0 * overload
        points.append(DropPoint(f"{task}.in", rate=rate))
        cost = float(series.mean()) / 100.0
        operators.append(Operator(task, agent_of[task], cost, rng.uniform(0.3, 1.0),
                                  (f"{task}.in",)))
        sinks.append(Sink(f"{task}.out", task, rng.choice((1.0, 2.0, 5.0))))
        if i % 10 == 0:  # a branch through a channel to another agent
            points.append(DropPoint(f"{task}.ch", input=task))
            operators.append(Operator(f"{task}.b", rng.choice(names), cost, 1.0,
                                      (f"{task}.ch",)))
            sinks.append(Sink(f"{task}.bout", f"{task}.b", 1.0))
    return ShedProblem(tuple(points), tuple(operators), tuple(sinks), capacity)


def run_once(agents: int, tasks: int, length: int, rounds: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    loads = recorded_loads(tasks, length, rng)
    placed = first_fit(loads, agents, capacity=0.9)
    first_peak = peak_load(placed, loads)
    policy = DistributionPolicy(threshold=0.02, cooldown_seconds=0.0, mode="one-way")
    round_seconds, moves = [], 0
    current = placed
    for r in range(rounds):
        start = time.perf_counter()
        found = plan_moves(current, loads, policy, now=float(r))
        round_seconds.append(time.perf_counter() - start)
        moves += len(found)
        current = apply_moves(current, found)
    distributed, distributor_s, distributor_moves = distributor_rounds(placed, loads, rounds,
                                                                      rng)
    problem = shed_problem(current, loads, overload=1.5, rng=rng)
    start = time.perf_counter()
    plan = plan_shedding(problem)
    shed_seconds = time.perf_counter() - start
    uniform = weighted_loss(problem, uniform_keep(problem, uniform_ratio(problem)))
    return {"round_s": max(round_seconds), "moves": moves, "first_peak": first_peak,
            "peak": peak_load(current, loads), "shed_s": shed_seconds,
            "lp_loss": plan.loss, "uniform_loss": uniform, "feasible": float(plan.feasible),
            "weights": sum(s.weight for s in problem.sinks), "distributor_s": distributor_s,
            "distributor_moves": distributor_moves, "distributor_peak": distributed}


def distributor_rounds(placed: dict[str, list[str]], loads: dict[str, np.ndarray],
                       rounds: int, rng: random.Random) -> tuple[float, float, int]:
    """`rounds` rounds of the scheduler's distributor from `placed` (cool-downs off, each
    round's moves taking their room): (peak after, slowest round's seconds, moves)."""
    tasks = list(loads)
    movable = frozenset(rng.sample(tasks, len(tasks) // 2))
    demand = {t: (0.1, 256.0) for t in tasks}
    free = {a: (rng.uniform(0.0, 1.0), rng.uniform(0.0, 4096.0)) for a in placed}
    settings = DistributionSettings(threshold=0.02, min_slots=2, task_cooldown_seconds=0.0,
                                    pair_cooldown_seconds=0.0)
    length = len(next(iter(loads.values())))
    slowest, moves = 0.0, 0
    for r in range(rounds):
        start = time.perf_counter()
        decision = decide_distribution(DistributionView(placed, movable, demand, free), loads,
                                       length, settings, now=float(r))
        slowest = max(slowest, time.perf_counter() - start)
        for m in decision.moves:
            for agent, sign in ((m.target, -1.0), (m.source, 1.0)):
                free[agent] = (free[agent][0] + sign * demand[m.task][0],
                               free[agent][1] + sign * demand[m.task][1])
        placed = apply_moves(placed, decision.moves)
        moves += len(decision.moves)
    return peak_load(placed, loads), slowest, moves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--length", type=int, default=48, help="samples per load series")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of pairwise moves")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = [run_once(args.agents, args.tasks, args.length, args.rounds, seed)
            for seed in range(args.repeats)]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)
    rows = [
        ["one round of pairwise moves, slowest (s)", f"{med('round_s'):.3f}", "< 1 s"],
        ["moves over all rounds", f"{med('moves'):.0f}", ""],
        ["peak load of the busiest agent, first fit", f"{med('first_peak'):.3f}", ""],
        ["peak load of the busiest agent, after moves", f"{med('peak'):.3f}",
         f"ratio {bench_util.ratio(med('peak'), med('first_peak')):.2f} of first fit"],
        ["one round of the scheduler's distributor, slowest (s)",
         f"{med('distributor_s'):.3f}", "< 1 s"],
        ["its moves over all rounds (half the tasks opted in, random room)",
         f"{med('distributor_moves'):.0f}", ""],
        ["peak load of the busiest agent, after its rounds", f"{med('distributor_peak'):.3f}",
         f"ratio {bench_util.ratio(med('distributor_peak'), med('first_peak')):.2f} of first "
         "fit"],
        ["shedding plan, one LP (s)", f"{med('shed_s'):.3f}", "< 1 s"],
        ["weighted loss, LP plan", f"{med('lp_loss'):.1f}", f"of {med('weights'):.0f}"],
        ["weighted loss, uniform random", f"{med('uniform_loss'):.1f}",
         f"LP/uniform {bench_util.ratio(med('lp_loss'), med('uniform_loss')):.2f}"],
    ]
    print(f"{args.agents} agents, {args.tasks} tasks, series of {args.length}, "
          f"median of {args.repeats}")
    print(bench_util.format_table(["figure", "value", "goal"], rows))


if __name__ == "__main__":
    main()
