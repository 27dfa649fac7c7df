"""Cost arithmetic: hourly price from rent or power, per million tokens, per request, API comparison."""

from __future__ import annotations

import pytest

from localinfer.usage.cost import Pricing, format_money, parse_api_price, pricing
from localinfer.errors import UsageError


def test_rented_machine_per_million_tokens():
    # $3.60/h at 100 tok/s: 360,000 tokens per hour -> $10 per million.
    p = pricing(price_per_hour=3.6)
    assert p.hourly == pytest.approx(3.6)
    assert p.per_million(100.0) == pytest.approx(10.0)
    assert p.per_million(50.0) == pytest.approx(20.0)


def test_own_hardware_energy_cost():
    # 250 W at 0.40 per kWh = 0.10 per hour; at 20 tok/s (72,000 tok/h) a million costs 1.3889.
    p = pricing(watts=250, kwh_price=0.40)
    assert p.hourly == pytest.approx(0.10)
    assert p.per_million(20.0) == pytest.approx(0.10 * 1e6 / 72_000)


def test_rent_and_energy_add_up():
    p = pricing(price_per_hour=1.0, watts=500, kwh_price=0.2)
    assert p.hourly == pytest.approx(1.1)


def test_cost_of_a_request_is_its_share_of_the_hour():
    p = pricing(price_per_hour=7.2)
    assert p.for_seconds(1.5) == pytest.approx(0.003)
    assert p.for_seconds(3600) == pytest.approx(7.2)


def test_unpriced_gives_none_not_zero():
    p = pricing()
    assert p.hourly is None and not p.priced
    assert p.per_million(100.0) is None
    assert p.for_seconds(2.0) is None
    assert p.api_cost(10, 10) is None


def test_unknown_or_zero_rate_has_no_cost():
    p = pricing(price_per_hour=1.0)
    assert p.per_million(None) is None
    assert p.per_million(0.0) is None


def test_api_price_input_and_output():
    assert parse_api_price("0.15,0.60") == (0.15, 0.60)
    assert parse_api_price("2") == (2.0, 2.0)
    assert parse_api_price(None) == (None, None)
    p = pricing(compare_api_price="0.15,0.60")
    # 1M in at 0.15 + 0.5M out at 0.60 = 0.45
    assert p.api_cost(1_000_000, 500_000) == pytest.approx(0.45)
    assert p.compares_api and not p.priced


@pytest.mark.parametrize("bad", ["cheap", "1,2,3", "1;2"])
def test_bad_api_price_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        parse_api_price(bad)


def test_watts_without_kwh_price_is_refused():
    with pytest.raises(UsageError, match="--watts and --kwh-price"):
        pricing(watts=100)
    with pytest.raises(UsageError, match="--watts and --kwh-price"):
        pricing(kwh_price=0.3)


def test_negative_prices_are_refused():
    with pytest.raises(UsageError):
        pricing(price_per_hour=-1)
    with pytest.raises(UsageError):
        pricing(compare_api_price="-1")


def test_to_json_reports_the_hourly_figure():
    data = Pricing(price_per_hour=2.0, api_input_per_million=1.0, api_output_per_million=3.0).to_json()
    assert data["hourly"] == 2.0
    assert data["api_output_per_million"] == 3.0


def test_format_money_keeps_small_amounts_readable():
    assert format_money(None) == "-"
    assert format_money(0) == "0"
    assert format_money(1234.5) == "1,234.50"
    assert format_money(12.345) == "12.35"
    assert format_money(0.5) == "0.5"
    assert format_money(0.0000123) == "1.23e-05"


def test_a_measured_workload_priced():
    from localinfer.usage.cost import for_workload

    p = pricing(price_per_hour=3.6, compare_api_price="1,3")
    # A 512-token prompt with a 128-token answer at 64 tok/s overall, 10 s a request.
    cost = for_workload(p, tokens_per_second=64.0, request_seconds=10.0, prompt_tokens=512, gen_tokens=128)
    assert cost["per_million_tokens"] == pytest.approx(3.6e6 / 3600 / 64)
    assert cost["per_request"] == pytest.approx(0.01)
    assert cost["api_per_request"] == pytest.approx((512 * 1 + 128 * 3) / 1e6)
    assert cost["api_per_million_tokens"] == pytest.approx((512 * 1 + 128 * 3) / 640)  # token-weighted mix
    assert for_workload(pricing(), tokens_per_second=1.0, request_seconds=1.0, prompt_tokens=1, gen_tokens=1) is None
