"""What the demo agents' actions take: an order, and an amount on it."""

from __future__ import annotations

from decimal import Decimal

import pydantic


class OrderArgs(pydantic.BaseModel):
    """The arguments of an action on one order; nothing undeclared."""

    model_config = pydantic.ConfigDict(extra="forbid")

    order_id: str = pydantic.Field(min_length=1, max_length=64)


class OrderAmount(OrderArgs):
    """An amount of money on an order, as a reviewer may approve it."""

    amount: Decimal = pydantic.Field(
        gt=0, le=Decimal("100000"), max_digits=9, decimal_places=2
    )
    currency: str = pydantic.Field(pattern=r"^[A-Z]{3}$")
