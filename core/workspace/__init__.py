"""What a person keeps between sessions: the workspace database (:mod:`.store`) and the chat
sessions that read and write it (:mod:`.chat`). Qt-free, so the window and the CLI share it."""

from .chat import ChatSession, Reply
from .store import ACTIVE_LEAF, Conversation, Message, Workspace, WorkspaceError, metrics_line

__all__ = ["ACTIVE_LEAF", "ChatSession", "Conversation", "Message", "Reply", "Workspace", "WorkspaceError",
           "metrics_line"]
