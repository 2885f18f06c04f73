"""The web process of both modes: gunicorn's uvicorn workers serve this ASGI
application (config/gunicorn_conf.py), so streaming endpoints can be async views.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Requests run their sync code on threads of their own: Postgres connections
# come from a pool (config/settings.py, DATABASE_POOL_*), not one per thread.
os.environ.setdefault("DATABASE_POOL", "true")
application = get_asgi_application()
