"""A deterministic chat model for the demo agent: no network, no weights.

It reads the customer's message and the order from the conversation and plans a
refund the way a tool-calling model would: an AIMessage with a short rationale
and one `refund_order` tool call. The same conversation always yields the same
plan, so tests and the demo are repeatable.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult

# What the customer says -> the reason a human reviewer reads.
_REASONS = [
    (r"damag|broken|crack|defect", "the customer reports the item arrived damaged"),
    (r"never (arrived|came)|not (arrived|delivered)|lost", "the parcel never arrived"),
    (r"wrong (item|size|colou?r)", "the customer received the wrong item"),
    (r"late|delay", "the delivery was late"),
]
_DEFAULT_REASON = "the customer asks for a refund and the order is refundable"


class RefundPlannerModel(BaseChatModel):
    """Plans `refund_order` for the order in the last human message."""

    @property
    def _llm_type(self) -> str:
        return "gatehouse-refund-planner"

    def _generate(
        self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any
    ) -> ChatResult:
        request = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        payload = json.loads(request.content)
        order = payload["order"]
        text = payload["customer_message"].lower()
        reason = next(
            (why for pattern, why in _REASONS if re.search(pattern, text)),
            _DEFAULT_REASON,
        )
        partial = re.search(r"partial|half", text)
        amount = order["amount"]
        if partial:
            amount = f"{float(order['amount']) / 2:.2f}"
        args = {
            "order_id": order["id"],
            "amount": amount,
            "currency": order.get("currency", "EUR"),
        }
        call_id = "call_" + hashlib.sha256(request.content.encode()).hexdigest()[:12]
        message = AIMessage(
            content=f"Plan: refund {amount} {args['currency']} on order {order['id']}, "
            f"because {reason}.",
            tool_calls=[{"name": "refund_order", "args": args, "id": call_id}],
            additional_kwargs={"reason": reason},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])
