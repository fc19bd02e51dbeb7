from django.urls import path

from chatapp.consumers import SessionConsumer

websocket_urlpatterns = [
    # Any id reaches the consumer, which refuses ids that are not the user's (close code 4403).
    path("ws/sessions/<str:session_id>/", SessionConsumer.as_asgi()),
]
