"""What tokens cost on this machine, from measured throughput and what the user pays for it.

One hourly figure drives everything: the rent of a machine (``--price-per-hour``), or the energy
of your own hardware (``--watts`` x ``--kwh-price`` / 1000), or both added together. Then, for a
workload that keeps the machine busy:

    cost per token            = hourly / 3600 / tokens_per_second
    cost per million tokens   = hourly * 1e6 / (3600 * tokens_per_second)
    cost of a request         = hourly * request_seconds / 3600

An API price per million tokens (``--compare-api-price IN[,OUT]``) is shown next to it: the input
price for prompt tokens, the output price for generated tokens (one number: the same for both).
See docs/usage-and-cost.md ("Cost") for what these figures leave out (idle time, the machine's purchase price).
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.errors import UsageError

MILLION = 1_000_000


@dataclass(frozen=True)
class Pricing:
    """What running the machine costs per hour, and an API price to compare with (per 1M tokens)."""

    price_per_hour: float | None = None  # a rented machine, in currency units per hour
    watts: float | None = None  # average power draw of your own hardware while it works
    kwh_price: float | None = None  # electricity price per kWh
    api_input_per_million: float | None = None
    api_output_per_million: float | None = None

    @property
    def hourly(self) -> float | None:
        """Cost of one hour of the machine working; None when nothing was priced."""
        parts = []
        if self.price_per_hour is not None:
            parts.append(self.price_per_hour)
        if self.watts is not None and self.kwh_price is not None:
            parts.append(self.watts / 1000.0 * self.kwh_price)
        return sum(parts) if parts else None

    @property
    def priced(self) -> bool:
        return self.hourly is not None

    @property
    def compares_api(self) -> bool:
        return self.api_input_per_million is not None or self.api_output_per_million is not None

    def per_million(self, tokens_per_second: float | None) -> float | None:
        """Cost of a million tokens at this rate (None when unpriced or the rate is unknown)."""
        hourly = self.hourly
        if hourly is None or not tokens_per_second or tokens_per_second <= 0:
            return None
        return hourly * MILLION / (3600.0 * tokens_per_second)

    def for_seconds(self, seconds: float | None) -> float | None:
        """Cost of keeping the machine busy this long (a request, a run of requests)."""
        hourly = self.hourly
        if hourly is None or seconds is None:
            return None
        return hourly * seconds / 3600.0

    def api_cost(self, input_tokens: int, output_tokens: int) -> float | None:
        """What the API would charge for the same tokens."""
        if not self.compares_api:
            return None
        cin = self.api_input_per_million or 0.0
        cout = self.api_output_per_million if self.api_output_per_million is not None else cin
        return (input_tokens * cin + output_tokens * cout) / MILLION

    def to_json(self) -> dict:
        return {
            "price_per_hour": self.price_per_hour,
            "watts": self.watts,
            "kwh_price": self.kwh_price,
            "hourly": self.hourly,
            "api_input_per_million": self.api_input_per_million,
            "api_output_per_million": self.api_output_per_million,
        }


def for_workload(
    pricing: Pricing, *, tokens_per_second: float, request_seconds: float, prompt_tokens: int, gen_tokens: int
) -> dict[str, float | None] | None:
    """A measured workload priced: per million of the tokens its rate counts, per request, and what
    the API charges (input price for prompt tokens, output price for generated ones, mixed by count)."""
    if not pricing.priced and not pricing.compares_api:
        return None
    api_request = pricing.api_cost(prompt_tokens, gen_tokens)
    counted = prompt_tokens + gen_tokens
    return {
        "per_million_tokens": pricing.per_million(tokens_per_second),
        "per_request": pricing.for_seconds(request_seconds),
        "api_per_million_tokens": api_request * MILLION / counted if api_request is not None and counted else None,
        "api_per_request": api_request,
    }


def parse_api_price(value: str | None) -> tuple[float | None, float | None]:
    """``"0.15,0.60"`` -> (input, output) per million tokens; one number means both."""
    if value is None or not value.strip():
        return None, None
    parts = [p.strip() for p in value.split(",")]
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise UsageError(
            f"--compare-api-price must be a price per million tokens, or INPUT,OUTPUT; not {value!r}"
        ) from None
    if len(numbers) == 1:
        return numbers[0], numbers[0]
    if len(numbers) == 2:
        return numbers[0], numbers[1]
    raise UsageError(f"--compare-api-price takes one or two numbers (INPUT,OUTPUT), not {value!r}")


def pricing(
    *,
    price_per_hour: float | None = None,
    watts: float | None = None,
    kwh_price: float | None = None,
    compare_api_price: str | None = None,
) -> Pricing:
    """Check and combine the cost options; watts and kWh price only make sense together."""
    if (watts is None) != (kwh_price is None):
        raise UsageError(
            "--watts and --kwh-price go together",
            hint="give both (own hardware: power draw x electricity price), or --price-per-hour for a rented machine",
        )
    for flag, v in (("--price-per-hour", price_per_hour), ("--watts", watts), ("--kwh-price", kwh_price)):
        if v is not None and v < 0:
            raise UsageError(f"{flag} must not be negative")
    api_in, api_out = parse_api_price(compare_api_price)
    if (api_in is not None and api_in < 0) or (api_out is not None and api_out < 0):
        raise UsageError("--compare-api-price must not be negative")
    return Pricing(price_per_hour, watts, kwh_price, api_in, api_out)


def format_money(value: float | None) -> str:
    """Small amounts keep significant digits ($0.000012), large ones two decimals."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.2f}"
    if abs(value) >= 0.01:
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{value:.3g}"
