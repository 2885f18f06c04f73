#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A configuration the operator must fix: its message says what, one
        # line per problem; a traceback would only bury it.
        sys.exit(f"Gatehouse cannot start:\n{exc}")


if __name__ == "__main__":
    main()
