"""What operators' commands print: progress on one line, their own procedure."""

import base64
import io

import pytest
from django.core.management import call_command
from django.test import override_settings

from runs.management.commands.rotate_master_key import Command as RotateMasterKey
from runs.models import Thread
from tests.factories import make_tenant


def _key(key_id: str, fill: str) -> str:
    return f"{key_id}:{base64.b64encode(fill.encode() * 32).decode()}"


OLD, NEW = _key("old", "o"), _key("new", "n")


@pytest.mark.django_db
def test_the_progress_bar_redraws_one_line():
    tenant = make_tenant()
    with override_settings(GATEHOUSE_MASTER_KEYS=OLD):
        for number in range(5):
            Thread.objects.create_with_data_key(tenant=tenant, thread_id=f"t-{number}")
    out, err = io.StringIO(), io.StringIO()
    with override_settings(GATEHOUSE_MASTER_KEYS=f"{NEW},{OLD}"):
        call_command("rotate_master_key", batch_size=1, stdout=out, stderr=err)
    assert "rewrapped 5" in out.getvalue()
    bar = err.getvalue()
    # Each redraw returns to the start of the line; only closing the bar ends it.
    assert bar.count("\r") >= 2 and "5/5" in bar
    assert bar.count("\n") == 1 and bar.endswith("\n")


@pytest.mark.django_db
def test_retention_run_shows_one_bar_line_per_job():
    out, err = io.StringIO(), io.StringIO()
    call_command("retention_run", "prune_checkpoints", stdout=out, stderr=err)
    assert err.getvalue().count("\n") == 1
    assert "prune_checkpoints: 0 threads" in err.getvalue()
    assert "so far" not in out.getvalue()


def test_rotate_master_key_help_says_the_procedure():
    help_text = (
        RotateMasterKey().create_parser("manage.py", "rotate_master_key").format_help()
    )
    assert "put it FIRST in GATEHOUSE_MASTER_KEYS" in help_text
    assert "2. Run this command" in help_text
    assert "remove them from GATEHOUSE_MASTER_KEYS" in help_text
    assert "docs/checkpoints.md" in help_text
