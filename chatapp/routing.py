from django.urls import path, re_path

from chatapp.consumers import NotFoundConsumer, SessionConsumer

websocket_urlpatterns = [
    # Any id reaches the consumer, which refuses ids that are not the user's (close code 4403).
    path("ws/sessions/<str:session_id>/", SessionConsumer.as_asgi()),
    # A new chat's landing: its first message makes the chat, and the socket is that chat's from then on.
    path("ws/new/", SessionConsumer.as_asgi()),
    # Any other path is refused like an unknown URL (URLRouter would raise: a 500 with a traceback).
    re_path(r"", NotFoundConsumer.as_asgi()),
]
