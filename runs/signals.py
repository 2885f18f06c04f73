"""Signals that `runs` sends so that other apps can react without `runs`
importing them (see the design's import rules)."""

import django.dispatch

# Sent inside the transaction that marks a run interrupted, with
# `run` (runs.models.Run) and `interrupts` (a list of langgraph Interrupt).
# A receiver that finds an interrupt unacceptable raises InterruptRejected:
# the transaction rolls back and the run fails with the receiver's message.
run_interrupted = django.dispatch.Signal()

# Sent inside the transaction that migrates a thread to another agent version
# (runs.services.migration), with `thread` and `moved` ({old interrupt id: new
# interrupt id}): the thread still waits on the same interrupts, under the ids
# LangGraph gives them in the new checkpoint.
interrupts_moved = django.dispatch.Signal()


# Sent inside the transaction that closes a failed thread without running it
# again (runs.services.thread_close), with `thread`, `actor` (an
# audit.services.Actor) and `reason`: whatever waits on its interrupts can no
# longer be answered.
thread_closed = django.dispatch.Signal()


class InterruptRejected(Exception):
    """An interrupt's payload breaks the contract; the message says how."""
