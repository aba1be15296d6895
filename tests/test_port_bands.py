"""Port bands of embedded agents (`embedded_mesos.ports`): free when claimed, never shared by
two runs on one machine, outside the ephemeral range. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket

import pytest

from embedded_mesos.ports import NoFreeBand, candidate_bands, claim_band, port_bindable


def test_candidate_bands_skip_the_ephemeral_range() -> None:
    bands = list(candidate_bands(100, (32768, 60999), low=32500, high=61200))
    assert bands == [(32500, 32599), (32600, 32699), (61000, 61099), (61100, 61199)]
    assert all(last - first == 99 for first, last in bands)


def test_two_claims_get_disjoint_bands_whose_ports_are_all_bindable() -> None:
    first = claim_band(20)
    second = claim_band(20)
    try:
        a = set(range(first.low, first.high + 1))
        b = set(range(second.low, second.high + 1))
        assert len(a) == len(b) == 20 and not a & b
        assert all(port_bindable(p) for p in a | b)
        assert not port_bindable(first.low - 1)  # the claim is held
    finally:
        first.release()
        second.release()
    assert port_bindable(first.low - 1)


def test_a_band_with_a_port_in_use_is_passed_over() -> None:
    probe = claim_band(20)
    probe.release()  # the band the next claim would take: make one of its ports busy
    busy = socket.socket()
    busy.bind(("127.0.0.1", probe.low + 5))
    busy.listen(1)
    try:
        claim = claim_band(20)
        try:
            assert not claim.low <= probe.low + 5 <= claim.high
        finally:
            claim.release()
    finally:
        busy.close()


def test_no_free_band_is_a_clear_error() -> None:
    with pytest.raises(NoFreeBand, match="no band of 10 free ports"):
        claim_band(10, probe=lambda port: False)


def test_the_test_stacks_agents_take_their_ports_below_the_ephemeral_range_too() -> None:
    from embedded_mesos.ports import ephemeral_range
    from testkit.e2e_support import disjoint_port_ranges, free_port_range

    ephemeral_low = ephemeral_range()[0]
    ranges = disjoint_port_ranges(3)
    ports = [p for low, high in ranges for p in range(low, high + 1)]
    assert len(ports) == len(set(ports)) == 3 * 16
    assert all(20000 <= p < ephemeral_low for p in ports)
    low, high = free_port_range(16)
    assert 20000 <= low <= high < ephemeral_low
