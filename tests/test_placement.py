"""Placement as a pure function: first fit, gang per query, ports and endpoints, apart_from,
executor share, and a reason for every unplaced demand and declined offer."""

from __future__ import annotations

from scheduler.placement import (
    Offer, QueryDemand, Share, TaskDemand, place,
)


def demand(task_id: str, cpus: float = 1.0, mem: float = 512.0, outputs: tuple[str, ...] = (),
           inputs: tuple[str, ...] = (), **kw) -> TaskDemand:
    return TaskDemand(task_id, cpus, mem, outputs, inputs, **kw)


def offer(oid: str, agent: str, cpus: float = 4.0, mem: float = 8192.0,
          ports: tuple[tuple[int, int], ...] = ((31000, 31009),), **kw) -> Offer:
    return Offer(oid, agent, f"host-{agent}", cpus, mem, ports, **kw)


def in_ranges(port: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(b <= port <= e for b, e in ranges)


def test_gang_gets_ports_from_its_agents_offer_and_matching_endpoints() -> None:
    ranges = ((31000, 31001), (32000, 32005))
    q = QueryDemand("q", (demand("q.t0", outputs=("q/a", "q/b")),
                          demand("q.t1", inputs=("q/a",), outputs=("q/c",)),
                          demand("q.t2", inputs=("q/b", "q/c"))))
    r = place([offer("o1", "a1", ports=ranges)], [q])
    assert r.unplaced == () and r.declined == ()
    assert r.used_offers == {"a1": ("o1",)}
    (qp,) = r.placed
    by_task = {a.task_id: a for a in qp.assignments}
    all_ports = [p for a in qp.assignments for p in a.ports]
    assert len(all_ports) == 3 == len(set(all_ports))
    assert all(in_ranges(p, ranges) for p in all_ports)
    t0, t1, t2 = by_task["q.t0"], by_task["q.t1"], by_task["q.t2"]
    assert t0.endpoints == {"q/a": f"tcp://host-a1:{t0.ports[0]}",
                            "q/b": f"tcp://host-a1:{t0.ports[1]}"}
    assert t1.endpoints == {"q/a": t0.endpoints["q/a"], "q/c": f"tcp://host-a1:{t1.ports[0]}"}
    assert t2.endpoints == {"q/b": t0.endpoints["q/b"], "q/c": t1.endpoints["q/c"]}
    assert t2.ports == ()


def test_first_fit_fills_the_first_offer_before_the_next() -> None:
    q = QueryDemand("q", tuple(demand(f"q.t{i}", cpus=1.0) for i in range(3)))
    r = place([offer("o1", "a1", cpus=2.0), offer("o2", "a2", cpus=8.0)], [q])
    agents = [a.agent_id for a in r.placed[0].assignments]
    assert agents == ["a1", "a1", "a2"]


def test_too_small_offers_are_declined_with_the_shortfall_named() -> None:
    q = QueryDemand("q", (demand("q.t0", cpus=2.0),))
    r = place([offer("o1", "a1", cpus=1.5), offer("o2", "a2", cpus=1.0)], [q])
    assert r.placed == ()
    (u,) = r.unplaced
    assert u.task_id == "q.t0"
    assert "needs 2 cpus, offer has 1.5 on agent a1" in u.reason
    assert {d.offer_id for d in r.declined} == {"o1", "o2"}
    assert all("q.t0" in d.reason and "needs 2 cpus" in d.reason for d in r.declined)


def test_missing_memory_and_ports_are_named() -> None:
    q = QueryDemand("q", (demand("q.t0", mem=4096.0, outputs=("q/a", "q/b")),))
    r = place([offer("o1", "a1", mem=1024.0, ports=((31000, 31000),))], [q])
    reason = r.unplaced[0].reason
    assert "needs 4096 MB memory, offer has 1024" in reason
    assert "needs 2 ports, offer has 1" in reason


def test_gang_is_all_or_nothing_and_leaves_offers_for_the_next_query() -> None:
    big = QueryDemand("big", (demand("big.t0", cpus=3.0), demand("big.t1", cpus=3.0)))
    small = QueryDemand("small", (demand("small.t0", cpus=2.0),))
    r = place([offer("o1", "a1", cpus=4.0)], [big, small])
    assert [qp.query_id for qp in r.placed] == ["small"]
    reasons = {u.task_id: u.reason for u in r.unplaced}
    assert "needs 3 cpus, offer has 1" in reasons["big.t1"]
    assert "waits for the rest of its query" in reasons["big.t0"]


def test_apart_from_puts_groups_on_distinct_agents() -> None:
    q = QueryDemand("q", (demand("q.t0", group="p1", apart_from=("p2",)),
                          demand("q.t1", group="p2", apart_from=("p1",)),
                          demand("q.t2", group="p1")))
    r = place([offer("o1", "a1"), offer("o2", "a2")], [q])
    agents = {a.task_id: a.agent_id for a in r.placed[0].assignments}
    assert agents == {"q.t0": "a1", "q.t1": "a2", "q.t2": "a1"}


def test_apart_from_is_honoured_when_only_one_side_lists_it() -> None:
    q = QueryDemand("q", (demand("q.t0", group="p1"),
                          demand("q.t1", group="p2", apart_from=("p1",))))
    assert {a.agent_id for a in place([offer("o1", "a1"), offer("o2", "a2")],
                                      [q]).placed[0].assignments} == {"a1", "a2"}
    q2 = QueryDemand("q", (demand("q.t0", group="p1", apart_from=("p2",)),
                           demand("q.t1", group="p2")))
    assert {a.agent_id for a in place([offer("o1", "a1"), offer("o2", "a2")],
                                      [q2]).placed[0].assignments} == {"a1", "a2"}


def test_apart_from_with_one_agent_is_unplaced_with_reason() -> None:
    q = QueryDemand("q", (demand("q.t0", group="p1"),
                          demand("q.t1", group="p2", apart_from=("p1",))))
    r = place([offer("o1", "a1")], [q])
    assert r.placed == ()
    reason = {u.task_id: u.reason for u in r.unplaced}["q.t1"]
    assert "apart_from" in reason and "a1 holds p1" in reason


def test_apart_from_counts_tasks_already_running() -> None:
    q = QueryDemand("q", (demand("q.t1", group="p2", apart_from=("p1",)),),
                    occupied={"a1": frozenset({"p1"})})
    r = place([offer("o1", "a1"), offer("o2", "a2")], [q])
    assert r.placed[0].assignments[0].agent_id == "a2"


def test_known_endpoints_of_running_producers_reach_a_consumer() -> None:
    q = QueryDemand("q", (demand("q.t1", inputs=("q/a",)),),
                    known_endpoints={"q/a": "tcp://host-a9:31005"})
    r = place([offer("o1", "a1")], [q])
    assert r.placed[0].assignments[0].endpoints == {"q/a": "tcp://host-a9:31005"}


def test_executor_share_is_charged_once_per_cold_agent() -> None:
    share = Share(0.5, 1500.0)
    two = QueryDemand("q", (demand("q.t0", cpus=1.0), demand("q.t1", cpus=1.0)))
    r = place([offer("o1", "a1", cpus=2.5)], [two], executor_share=share)
    assert len(r.placed) == 1 and r.executor_started_on == {"a1"}
    r = place([offer("o1", "a1", cpus=2.4)], [two], executor_share=share)
    assert r.placed == ()
    reasons = {u.task_id: u.reason for u in r.unplaced}
    assert "needs 1 cpus, offer has 0.9 on agent a1" in reasons["q.t1"]
    warm = offer("o1", "a1", cpus=2.0, executor_ids=("exec-a1",))
    r = place([warm], [two], executor_share=share, executor_id_for={"a1": "exec-a1"})
    assert len(r.placed) == 1 and r.executor_started_on == frozenset()


def test_several_offers_of_one_agent_are_used_together() -> None:
    q = QueryDemand("q", (demand("q.t0", cpus=3.0),))
    r = place([offer("o1", "a1", cpus=2.0), offer("o2", "a1", cpus=2.0)], [q])
    assert r.used_offers == {"a1": ("o1", "o2")}


def test_preferred_and_allowed_agents() -> None:
    q = QueryDemand("q", (demand("q.t0", preferred_agents=("a2",)),))
    assert place([offer("o1", "a1"), offer("o2", "a2")], [q]).placed[0].assignments[0] \
        .agent_id == "a2"
    q = QueryDemand("q", (demand("q.t0", allowed_agents=frozenset({"a3"})),))
    r = place([offer("o1", "a1")], [q])
    assert r.placed == () and "may use (a3)" in r.unplaced[0].reason


def test_preferred_port_is_kept_when_free() -> None:
    q = QueryDemand("q", (demand("q.t0", outputs=("q/a",), preferred_ports={"q/a": 31007}),))
    r = place([offer("o1", "a1")], [q])
    assert r.placed[0].assignments[0].ports == (31007,)


def test_unused_offers_are_declined_when_nothing_waits() -> None:
    r = place([offer("o1", "a1")], [])
    assert [(d.offer_id, d.reason) for d in r.declined] == [("o1", "no pending task needs it")]
