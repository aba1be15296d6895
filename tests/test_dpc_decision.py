"""The pure DPC decision (`common.dpc`): idle inputs never wait, a cut one makes the union hold
until max-delay, then go tentative, and its return starts a reconcile."""

from __future__ import annotations

import pytest

from common.dpc import (Action, InputView, Mode, State, delay_deadline, reconciled,
                        selector_view, step, waited_for)


def _views(a_heard: float, b_heard: float, b_reachable: bool) -> tuple[InputView, ...]:
    return (InputView("a", a_heard, True), InputView("b", b_heard, b_reachable))


def test_an_idle_reachable_input_never_delays_nor_goes_tentative() -> None:
    state = State()
    for now in (1.0, 10.0, 1000.0):
        decision = step(state, _views(now, 0.0, True), 3.0, now)
        assert decision.state.mode is Mode.STABLE and decision.action is Action.NONE
        assert not decision.hold
        state = decision.state


def test_a_cut_input_holds_then_goes_tentative_at_max_delay_after_it_was_last_heard() -> None:
    held = step(State(), _views(5.0, 4.0, False), 3.0, 5.0)
    assert held.action is Action.HOLD and held.hold and held.state.cut == ("b",)
    waiting = step(held.state, _views(6.9, 4.0, False), 3.0, 6.9)
    assert waiting.state.mode is Mode.DELAYING and waiting.action is Action.NONE
    assert waiting.state.since == 5.0
    gone = step(waiting.state, _views(7.0, 4.0, False), 3.0, 7.0)
    assert gone.state.mode is Mode.TENTATIVE and gone.action is Action.GO_TENTATIVE
    assert not gone.hold and gone.state.tentative_since == 7.0


def test_a_cut_that_heals_within_max_delay_releases_without_tentative_output() -> None:
    held = step(State(), _views(5.0, 4.0, False), 3.0, 5.0)
    back = step(held.state, _views(6.0, 6.0, True), 3.0, 6.0)
    assert back.state.mode is Mode.STABLE and back.action is Action.RELEASE


def test_the_return_of_the_cut_input_reconciles_once_then_stable() -> None:
    state = State(Mode.TENTATIVE, 7.0, ("b",), 7.0)
    still = step(state, _views(20.0, 4.0, False), 3.0, 20.0)
    assert still.state.mode is Mode.TENTATIVE and still.action is Action.NONE
    back = step(still.state, _views(21.0, 21.0, True), 3.0, 21.0)
    assert back.state.mode is Mode.RECONCILING and back.action is Action.RECONCILE
    assert back.state.tentative_since == 7.0
    again = step(back.state, _views(22.0, 22.0, False), 3.0, 22.0)
    assert again.state == back.state and again.action is Action.NONE  # reconciling finishes first
    assert reconciled(back.state, 25.0) == State(Mode.STABLE, 25.0)
    with pytest.raises(ValueError):
        reconciled(State(), 1.0)


def test_the_deadline_is_the_earliest_cut_input_plus_max_delay() -> None:
    views = (InputView("a", 9.0, False), InputView("b", 4.0, False), InputView("c", 1.0, True))
    assert delay_deadline(views, 3.0) == 7.0
    assert delay_deadline(views[2:], 3.0) == float("inf")
    with pytest.raises(ValueError):
        step(State(), views, 0.0, 1.0)


def test_a_selector_is_one_input_reachable_while_any_replica_is_and_heard_at_the_latest() -> None:
    a = InputView("rep.1", 4.0, False)
    b = InputView("rep.2", 6.0, True)
    assert selector_view("s", (a, b)) == InputView("s", 6.0, True)
    assert selector_view("s", (a, InputView("rep.2", 3.0, False))) == InputView("s", 4.0, False)
    assert selector_view("s", (b,)) == InputView("s", 6.0, True)
    with pytest.raises(ValueError, match="selector s"):
        selector_view("s", ())


def test_a_union_over_a_selector_waits_only_when_every_replica_is_cut() -> None:
    """One replica cut: no hold at all; both cut: hold, then tentative max-delay after the
    latest word of either replica (not the earlier one's)."""
    live = InputView("a", 10.0, True)

    def views(r1: InputView, r2: InputView) -> tuple[InputView, ...]:
        return (live, selector_view("sel", (r1, r2)))

    one_cut = step(State(), views(InputView("r1", 2.0, False), InputView("r2", 9.5, True)),
                   3.0, 10.0)
    assert one_cut.state.mode is Mode.STABLE and one_cut.action is Action.NONE
    both = views(InputView("r1", 2.0, False), InputView("r2", 9.5, False))
    held = step(State(), both, 3.0, 10.0)
    assert held.action is Action.HOLD and held.state.cut == ("sel",)
    assert delay_deadline(both, 3.0) == 12.5
    assert step(held.state, both, 3.0, 12.4).state.mode is Mode.DELAYING
    assert step(held.state, both, 3.0, 12.5).action is Action.GO_TENTATIVE


def test_without_max_delay_a_cut_input_holds_without_a_limit_and_releases_on_heal() -> None:
    """Consistency without loss (a union without max-delay): hold while the writer is cut,
    however long, never tentative (no stable point, no re-run), release when it answers."""
    held = step(State(), _views(5.0, 4.0, False), None, 5.0)
    assert held.action is Action.HOLD and held.hold and held.state.cut == ("b",)
    state = held.state
    for now in (7.0, 60.0, 86_400.0, 10.0 ** 9):
        waiting = step(state, _views(now, 4.0, False), None, now)
        assert waiting.state.mode is Mode.DELAYING and waiting.action is Action.NONE, now
        assert waiting.hold and waiting.state.since == 5.0
        state = waiting.state
    assert delay_deadline(_views(9.0, 4.0, False), None) == float("inf")
    back = step(state, _views(10.0 ** 9 + 1, 10.0 ** 9 + 1, True), None, 10.0 ** 9 + 1)
    assert back.state.mode is Mode.STABLE and back.action is Action.RELEASE
    assert back.state.tentative_since is None
    idle = step(back.state, _views(10.0 ** 9 + 2, 5.0, True), None, 10.0 ** 9 + 2)
    assert idle.state.mode is Mode.STABLE and not idle.hold  # idle, reachable: no wait
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            step(State(), _views(1.0, 1.0, True), bad, 1.0)


def test_an_ended_input_whose_writer_is_gone_is_never_cut() -> None:
    """A finished finite upstream (its writer said the stream ended at its last seq, and that
    seq is spooled) may go away: the union neither holds nor goes tentative for it; the same
    writer gone without an end is a cut."""
    ended = (InputView("a", 50.0, True), InputView("b", 4.0, False, ended=True))
    for max_delay in (None, 3.0):
        decision = step(State(), ended, max_delay, 50.0)
        assert decision.state.mode is Mode.STABLE and decision.action is Action.NONE
        assert delay_deadline(ended, max_delay) == float("inf")
    gone = (InputView("a", 50.0, True), InputView("b", 4.0, False))
    assert step(State(), gone, None, 50.0).action is Action.HOLD
    held = step(State(), gone, None, 50.0).state
    assert step(held, ended, None, 51.0).action is Action.RELEASE  # its end came, then it went
    assert not InputView("x", 1.0, False, ended=True).cut
    assert InputView("x", 1.0, False).cut and not InputView("x", 1.0, True).cut


def test_a_selector_has_ended_once_any_replica_said_so() -> None:
    """Replicas number alike: one replica's end (with its last seq spooled) ends the stream."""
    one = selector_view("s", (InputView("r1", 3.0, False, ended=True), InputView("r2", 2.0, False)))
    assert one.ended and not one.cut
    assert not selector_view("s", (InputView("r1", 3.0, False), InputView("r2", 2.0, False))).ended


def test_a_merger_waits_for_its_active_instances_never_for_a_dormant_or_retired_one() -> None:
    """A partitioned operator's merger over slots 1..3 through a rescale 3 -> 1 -> 2: an
    active instance whose writer is cut is waited for (without a limit: nothing lost), a slot
    retired by the scale-in (its channel no longer placed, its writer gone for good) or never
    launched is not, and a slot launched again by a scale-out is waited for again."""
    def slots(t: float, reachable: tuple[bool, bool, bool],
              dormant: tuple[bool, bool, bool]) -> tuple[InputView, ...]:
        return tuple(InputView(f"f_{i + 1}_out", t, r, dormant=d)
                     for i, (r, d) in enumerate(zip(reachable, dormant)))

    running = (False, False, False)
    assert waited_for(slots(1.0, (True, True, True), running)) == ()
    cut = slots(1.0, (True, False, True), running)  # slot 2's host partitioned
    assert waited_for(cut) == ("f_2_out",)
    held = step(State(), cut, None, 2.0)
    assert held.action is Action.HOLD and held.state.cut == ("f_2_out",)
    assert step(held.state, cut, None, 1e6).state.mode is Mode.DELAYING  # never tentative
    # scale-in to 1: slots 2 and 3 drained and retired, their writers gone, not placed
    retired = slots(1.0, (True, False, False), (False, True, True))
    assert waited_for(retired) == ()
    assert step(held.state, retired, None, 3.0).action is Action.RELEASE
    assert step(State(), retired, None, 4.0).action is Action.NONE
    # scale-out to 2: slot 2 placed again; until its writer answers it is waited for
    relaunching = slots(5.0, (True, False, False), (False, False, True))
    assert waited_for(relaunching) == ("f_2_out",)
    # a dormant slot with max-delay: never tentative for it
    assert step(State(), retired, 3.0, 1e6).state.mode is Mode.STABLE
    assert not InputView("x", 1.0, False, dormant=True).cut


def test_a_selector_is_dormant_only_when_every_replica_is() -> None:
    one = selector_view("s", (InputView("r1", 3.0, False, dormant=True),
                              InputView("r2", 2.0, False)))
    assert not one.dormant and one.cut
    both = selector_view("s", (InputView("r1", 3.0, False, dormant=True),
                               InputView("r2", 2.0, False, dormant=True)))
    assert both.dormant and not both.cut
