"""Template tags of the admin's project-wide templates."""

from django import template

from runs import crypto

register = template.Library()


@register.simple_tag
def development_key_warnings() -> list[str]:
    """The embedded mode's development-key warnings; none when real key rings are set."""
    return crypto.development_key_warnings()
