import pytest

from gpulane.core.durations import parse_duration
from gpulane.core.priority import SATURATION, band_of, parse_priority, resolve_priority


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100", 100),
        ("-100", -100),
        ("+7", 7),
        ("  42 \t", 42),
        ("interactive", 100),
        ("INTERACTIVE", 100),
        (" Batch ", -100),
        ("normal", 0),
        ("0", 0),
        ("-0", 0),
        (None, 0),
        ("", 0),
        ("high", 0),
        ("1e3", 0),
        ("10.5", 0),
        ("+ 5", 0),
        ("1_000", 0),
        ("٣", 0),  # non-ASCII digits are not a priority
        ("--1", 0),
        (True, 0),
        (12, 12),
    ],
)
def test_parse_priority_is_lenient(text, expected):
    assert parse_priority(text) == expected


def test_huge_values_saturate_instead_of_overflowing():
    assert parse_priority("9" * 3000) == SATURATION
    assert parse_priority("-" + "9" * 3000) == -SATURATION
    assert parse_priority("9" * 5000) == 0  # longer than any sane header: unparseable
    assert parse_priority(10**40) == SATURATION


def test_resolve_priority_is_strict():
    assert resolve_priority("batch") == -100
    assert resolve_priority(" -5 ") == -5
    assert resolve_priority(300) == 300
    with pytest.raises(ValueError, match="'urgent' is neither an integer nor one of interactive, normal, batch"):
        resolve_priority("urgent")
    with pytest.raises(ValueError, match="boolean"):
        resolve_priority(True)
    with pytest.raises(ValueError, match="got float"):
        resolve_priority(1.5)


@pytest.mark.parametrize(
    ("priority", "band"),
    [(-100, -1), (-51, -1), (-50, 0), (0, 0), (49, 0), (50, 1), (100, 1), (102, 1), (-98, -1), (250, 3)],
)
def test_band_of(priority, band):
    assert band_of(priority, 100) == band


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("4m", 240.0),
        ("12h", 43200.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("2d", 172800.0),
        (" 4M ", 240.0),
    ],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "not seconds or a string like"),
        (-1, "negative"),
        ("4 minutes", "not seconds"),
        (True, "a duration"),
        (None, "must be a number or a string"),
        (float("nan"), "not finite"),
        ("1" * 100 + "s", "not seconds"),
    ],
)
def test_parse_duration_rejects_with_a_clear_message(value, message):
    with pytest.raises(ValueError, match=message):
        parse_duration(value)
