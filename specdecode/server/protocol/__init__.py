"""The wire: request and response bodies of the APIs served (OpenAI's, Anthropic's Messages), their errors, bounded
body reading, server-sent events, tool calls, list pages and the batch file format. Pure shapes and parsing."""
