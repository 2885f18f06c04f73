"""Django's Postgres backend, sized for server-side binding (config.settings).

ENGINE = "config.postgresql" (config.settings sets it for every Postgres URL).
"""
