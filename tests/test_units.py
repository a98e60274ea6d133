import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topoopt.errors import ConfigError
from topoopt.units import (
    format_bandwidth,
    format_size,
    format_time,
    parse_bandwidth,
    parse_size,
    parse_time,
)


@pytest.mark.parametrize("text, bps", [
    ("100Gbps", 100e9), ("100 Gbps", 100e9), ("100Gbit/s", 100e9), ("100Gb/s", 100e9),
    ("25GB/s", 200e9), ("25GBps", 200e9), ("1.5Tbps", 1.5e12), ("10Mbps", 1e7),
    ("1Kibps", 1024.0), (400e9, 400e9), (100, 100.0),
])
def test_parse_bandwidth(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text, nbytes", [
    ("2MB", 2e6), ("2 MB", 2e6), ("512B", 512.0), ("1KiB", 1024.0), ("1.5GB", 1.5e9),
    ("3MiB", 3 * 2**20), ("0B", 0.0), ("20MB", 20e6), (1024, 1024.0),
])
def test_parse_size(text, nbytes):
    assert parse_size(text) == pytest.approx(nbytes)


@pytest.mark.parametrize("text, seconds", [
    ("4us", 4e-6), ("4µs", 4e-6), ("10ms", 1e-2), ("1s", 1.0), ("100ns", 1e-7),
    ("2min", 120.0), (0.5, 0.5),
])
def test_parse_time(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("parse, text", [
    (parse_bandwidth, "100Gbsp"), (parse_bandwidth, "fast"), (parse_bandwidth, "-1Gbps"),
    (parse_bandwidth, "0Gbps"), (parse_bandwidth, "100GB"), (parse_bandwidth, True),
    (parse_size, "-1MB"), (parse_size, "fast"), (parse_size, "2Mb"), (parse_size, "2 MBB"),
    (parse_size, float("nan")), (parse_size, [1]),
    (parse_time, "fast"), (parse_time, "-4us"), (parse_time, "4 parsecs"),
    (parse_time, float("inf")),
])
def test_rejects_bad_values_naming_them(parse, text):
    with pytest.raises(ConfigError) as err:
        parse(text, "cluster.thing")
    message = str(err.value)
    assert "cluster.thing" in message and repr(text) in message
    assert "\n" not in message


def test_format():
    assert format_bandwidth(100e9) == "100 Gbps"
    assert format_size(2e6) == "2 MB"
    assert format_size(512) == "512 B"
    assert format_time(4e-6) == "4 us"
    assert format_time(1e-2) == "10 ms"
    assert format_time(2.5) == "2.5 s"
    assert format_time(3e-9) == "3 ns"


@given(st.floats(min_value=1e-3, max_value=1e15, allow_nan=False))
def test_size_round_trip(value):
    assert parse_size(format_size(value).replace(" ", "").replace("kB", "KB")) == \
        pytest.approx(value, rel=1e-3)


@given(st.floats(min_value=1.0, max_value=1e15))
def test_bandwidth_round_trip(value):
    assert math.isclose(parse_bandwidth(format_bandwidth(value)), value, rel_tol=1e-3)
