"""BlobGarbagePolicy: when a bookie collects the garbage in its blob files (pure decisions)."""

from __future__ import annotations

import pytest

from bookie.storage import BlobGarbagePolicy, BlobGcPass

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("ratio", "min_mb", "blob_mb", "garbage_mb", "due"),
    [
        (0.5, 64, 1000, 499, False),  # under the ratio
        (0.5, 64, 1000, 500, True),  # at the ratio
        (0.5, 64, 100, 60, False),  # over the ratio but under the minimum: not worth a pass
        (0.5, 64, 128, 64, True),
        (0.5, 0, 10, 0, False),  # no garbage: never, whatever the minimum
        (0.5, 0, 10, 5, True),
        (0.2, 64, 1000, 200, True),  # BookKeeper's minor threshold: frees 1 byte per 4 copied
        (0.8, 64, 1000, 700, False),
        (1.0, 0, 100, 99, False),  # ratio 1: only blob files that are all garbage
        (1.0, 0, 100, 100, True),
    ],
)
def test_a_pass_is_due_at_the_garbage_ratio_and_minimum(
    ratio: float, min_mb: int, blob_mb: int, garbage_mb: int, due: bool
) -> None:
    assert BlobGarbagePolicy(ratio, min_mb * MIB).due(blob_mb * MIB, garbage_mb * MIB) is due


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_ratio_outside_0_1_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match="ratio"):
        BlobGarbagePolicy(ratio)


def test_negative_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="minimum"):
        BlobGarbagePolicy(0.5, -1)


def test_the_bytes_a_pass_copies_per_byte_it_frees_are_bounded_by_the_ratio() -> None:
    """Whenever a pass is due, the live bytes it copies are at most (1 - ratio) / ratio of the bytes it frees."""
    for ratio in (0.2, 0.5, 0.8):
        policy = BlobGarbagePolicy(ratio, 0)
        for blob in range(1, 200):
            for garbage in range(0, blob + 1):
                if policy.due(blob, garbage):
                    assert (blob - garbage) <= (1 - ratio) / ratio * garbage + 1e-9


def test_a_pass_needs_room_for_its_copies_and_a_margin() -> None:
    policy = BlobGarbagePolicy(0.5, 0)
    margin = BlobGarbagePolicy.ROOM_MARGIN_BYTES
    assert policy.room(1000 * MIB, 600 * MIB, 400 * MIB + margin)  # copies the live 400 MiB
    assert not policy.room(1000 * MIB, 600 * MIB, 400 * MIB + margin - 1)
    assert policy.room(100 * MIB, 100 * MIB, margin)  # nothing live: only the margin
    assert not policy.room(100 * MIB, 100 * MIB, margin - 1)


def test_a_pass_reports_what_it_freed() -> None:
    assert BlobGcPass(100, 60, 40, 0, 0.1).reclaimed_bytes == 60
    assert BlobGcPass(100, 0, 120, 0, 0.1).reclaimed_bytes == 0  # writes went on meanwhile: never negative
