"""Mounted at /agent/v1/volume-moves/ (agents.protocol.VOLUME_MOVES_PATH)."""
from __future__ import annotations

from django.urls import path

from volumes.api.agent_views import MoveChunkApi, MoveFailedApi, MoveReceivedApi, MoveSentApi

urlpatterns = [
    path("<uuid:move_id>/chunks/<int:seq>", MoveChunkApi.as_view(), name="agent-volume-move-chunk"),
    path("<uuid:move_id>/sent", MoveSentApi.as_view(), name="agent-volume-move-sent"),
    path("<uuid:move_id>/received", MoveReceivedApi.as_view(), name="agent-volume-move-received"),
    path("<uuid:move_id>/failed", MoveFailedApi.as_view(), name="agent-volume-move-failed"),
]
