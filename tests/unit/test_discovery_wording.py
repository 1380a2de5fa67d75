"""What a discovery tick says it looked at: files, or an enumerator's own inputs."""

from __future__ import annotations

from enumerator_service import DiscoveryResult


def test_a_tick_names_what_it_counted_in_the_singular_or_the_plural() -> None:
    assert DiscoveryResult(12, 12, {}).seen == "12 files seen"
    assert DiscoveryResult(1, 0, {}).seen == "1 file seen"
    assert DiscoveryResult(1, 1, {}, seen_unit="streams").seen == "1 stream seen"
    assert DiscoveryResult(4, 0, {}, seen_unit="partitions").seen == "4 partitions seen"
    assert DiscoveryResult(2_500, 3, {}, seen_unit="key ranges").seen == "2,500 key ranges seen"


def test_only_a_file_tick_has_the_file_only_counts_mean_something() -> None:
    assert DiscoveryResult(3, 3, {}).of_files
    assert not DiscoveryResult(3, 3, {}, seen_unit="chunks").of_files
