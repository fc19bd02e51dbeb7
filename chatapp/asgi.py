import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the apps loaded above)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from chatapp.routing import websocket_urlpatterns  # noqa: E402
from chatapp.socket_origin import SameOriginValidator  # noqa: E402

from django.conf import settings  # noqa: E402

application = ProtocolTypeRouter(
    {
        # In development static files come from the app folders; in production WhiteNoise serves the
        # collected ones (chatapp/settings.py).
        "http": ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app,
        "websocket": AllowedHostsOriginValidator(SameOriginValidator(AuthMiddlewareStack(URLRouter(
            websocket_urlpatterns)))),
    }
)

# What the imports made (Django, channels, the apps) lives as long as the server: freeze it, so that a
# full collection walks only what was made since, and its pause, which every socket of the process
# feels, stays short.
gc.collect()
gc.freeze()
