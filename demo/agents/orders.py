"""What the demo agents' money-moving actions take: an amount on an order."""

from __future__ import annotations

from decimal import Decimal

import pydantic


class OrderAmount(pydantic.BaseModel):
    """An amount of money on an order, as a reviewer may approve it."""

    model_config = pydantic.ConfigDict(extra="forbid")

    order_id: str = pydantic.Field(min_length=1, max_length=64)
    amount: Decimal = pydantic.Field(
        gt=0, le=Decimal("100000"), max_digits=9, decimal_places=2
    )
    currency: str = pydantic.Field(pattern=r"^[A-Z]{3}$")
