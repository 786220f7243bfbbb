"""The routes of the APIs beyond completions and chat: Responses, Anthropic's Messages, Conversations, Files and
Batches. app.py mounts them."""
